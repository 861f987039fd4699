// Package ring maps partitions to owner members.
//
// Model: a client key is hashed elsewhere (seeded xxhash64) to a keyHash;
// partition = keyHash % Config.Partitions; each partition has one owner and,
// with two or more members, one backup. The assignment is computed once, in
// New, by github.com/buraksezer/consistent (consistent hashing with bounded
// loads, xxhash64 as its hasher) and copied into flat per-partition index
// tables, so lookups are O(1), allocation-free and never call consistent.
//
// Determinism: New sorts members by ID before handing them to consistent, so
// every node that builds a ring from the same Config and the same member set
// gets the identical ring, whatever order the members were added in.
//
// Backup: the backup of partition p is the member that would own p if p's
// owner were removed from the member set (the owner of p in the ring built
// without it). When an owner dies and the membership change removes it, each
// of its partitions therefore lands on the node that already holds its
// replicated state. (consistent's GetClosestN is not used: its "next member"
// is the next member name in hash order, the same for all of an owner's
// partitions, so one node would inherit all of a dead node's load.)
//
// Concurrency: a Ring is immutable; all its methods are safe for concurrent
// use. A membership change builds a new Ring (with a new epoch) and callers
// swap pointers (e.g. with atomic.Pointer[Ring]). The zero Ring is not
// usable; build rings with New. The package has no global state.
package ring

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Member is a cluster member. Only ID takes part in placement; the addresses
// are carried along for the callers' convenience.
type Member struct {
	ID   string // unique node id
	HTTP string // host:port of the HTTP API
	Raft string // host:port of raft
	Peer string // host:port of the data plane (check forwarding)
}

// Ring is an immutable partition → owner/backup assignment for one epoch.
// See the package comment for the model and concurrency rules.
type Ring struct {
	cfg     Config
	epoch   uint64
	nparts  uint64   // uint64(cfg.Partitions), for Partition
	members []Member // sorted by ID
	owner   []int32  // partition → index into members, -1 when none
	backup  []int32  // partition → index into members, -1 when none
	counts  []int    // member index → number of partitions owned
}

// noMember marks a partition without owner or backup.
const noMember = -1

// New builds the ring for epoch from the active members. The order of members
// does not matter. It returns an error wrapping ErrInvalidConfig,
// ErrEmptyMemberID, ErrDuplicateMember, ErrTooManyMembers or (never expected)
// ErrPlacement. With no members it returns a valid empty ring whose lookups
// report no owner. A member may own no partitions when members is close to
// Partitions.
//
// New costs one consistent placement plus one more per member (for the
// backups), roughly quadratic in the member count: with the default config
// about 2 ms for 3 members, 10 ms for 10 and 100 ms for 50. It is meant to
// run on membership changes, not per request.
func New(cfg Config, epoch uint64, members []Member) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	for i := range ms {
		if ms[i].ID == "" {
			return nil, ErrEmptyMemberID
		}
		if i > 0 && ms[i].ID == ms[i-1].ID {
			return nil, fmt.Errorf("%w: %q", ErrDuplicateMember, ms[i].ID)
		}
	}
	if len(ms) > cfg.Partitions {
		return nil, fmt.Errorf("%w: %d members, %d partitions", ErrTooManyMembers, len(ms), cfg.Partitions)
	}
	r := &Ring{
		cfg:     cfg,
		epoch:   epoch,
		nparts:  uint64(cfg.Partitions),
		members: ms,
		owner:   make([]int32, cfg.Partitions),
		backup:  make([]int32, cfg.Partitions),
		counts:  make([]int, len(ms)),
	}
	for p := range r.owner {
		r.owner[p], r.backup[p] = noMember, noMember
	}
	if len(ms) == 0 {
		return r, nil
	}
	if err := r.place(); err != nil {
		return nil, err
	}
	for _, o := range r.owner {
		r.counts[o]++
	}
	return r, nil
}

// xxHasher is consistent's hasher: plain (unseeded) xxhash64. The seed that
// protects bucket keys is applied before keyHash reaches this package; here
// the hash only places member names and partition numbers.
type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// cmember is a member as consistent sees it. consistent names virtual node i
// of a member fmt.Sprintf("%s%d", name, i), so raw IDs "a" and "a1" would
// share virtual node "a10". A quoted ID is self-delimiting, so name+i is
// unique per (ID, i).
type cmember struct {
	name string // quoteID(ID)
	idx  int32  // index into Ring.members
}

func (m cmember) String() string { return m.name }

func quoteID(id string) string { return strconv.Quote(id) }

// place fills r.owner and r.backup using consistent. consistent reports
// trouble by panicking; Validate and New's checks are meant to rule that
// out, and any panic left is turned into ErrPlacement.
func (r *Ring) place() (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: consistent: %v", ErrPlacement, v)
		}
	}()
	cms := make([]consistent.Member, len(r.members))
	for i, m := range r.members {
		cms[i] = cmember{name: quoteID(m.ID), idx: int32(i)}
	}
	c := consistent.New(cms, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    r.cfg.Partitions,
		ReplicationFactor: r.cfg.ReplicationFactor,
		Load:              r.cfg.Load,
	})
	if err := ownersFrom(c, r.owner, nil); err != nil {
		return err
	}
	if len(cms) < 2 {
		return nil
	}
	// Backups: remove each member in turn; the owners of its partitions in
	// the remaining ring are their backups. consistent recomputes the whole
	// assignment on Remove and Add, so after Add(m) c is the full ring again.
	for i, cm := range cms {
		c.Remove(cm.String())
		if err := ownersFrom(c, r.backup, func(p int) bool { return r.owner[p] == int32(i) }); err != nil {
			return err
		}
		c.Add(cm)
	}
	return nil
}

// ownersFrom copies consistent's owner of every partition p (for which
// want(p), or all when want is nil) into dst[p].
func ownersFrom(c *consistent.Consistent, dst []int32, want func(p int) bool) error {
	for p := range dst {
		if want != nil && !want(p) {
			continue
		}
		m, ok := c.GetPartitionOwner(p).(cmember)
		if !ok {
			return fmt.Errorf("%w: consistent left partition %d without owner", ErrPlacement, p)
		}
		dst[p] = m.idx
	}
	return nil
}

// Epoch returns the epoch the ring was built for.
func (r *Ring) Epoch() uint64 { return r.epoch }

// Config returns the configuration the ring was built with.
func (r *Ring) Config() Config { return r.cfg }

// Members returns a copy of the members, sorted by ID.
func (r *Ring) Members() []Member { return slices.Clone(r.members) }

// Member returns the member with the given ID.
func (r *Ring) Member(id string) (Member, bool) {
	i, ok := r.index(id)
	if !ok {
		return Member{}, false
	}
	return r.members[i], true
}

func (r *Ring) index(id string) (int, bool) {
	return slices.BinarySearchFunc(r.members, id, func(m Member, id string) int { return cmp.Compare(m.ID, id) })
}

// Partition returns keyHash % Partitions.
func (r *Ring) Partition(keyHash uint64) uint32 { return uint32(keyHash % r.nparts) }

// Owner returns the owner of partition p; false if the ring is empty or p is
// out of range.
func (r *Ring) Owner(p uint32) (Member, bool) { return r.lookup(r.owner, p) }

// Backup returns the backup of partition p: the member that owns p in the
// ring without p's owner. It is never the owner; false with fewer than two
// members or p out of range.
func (r *Ring) Backup(p uint32) (Member, bool) { return r.lookup(r.backup, p) }

func (r *Ring) lookup(table []int32, p uint32) (Member, bool) {
	if uint(p) >= uint(len(table)) {
		return Member{}, false
	}
	i := table[p]
	if i < 0 {
		return Member{}, false
	}
	return r.members[i], true
}

// Index returns the position of member id in the ring's members (sorted
// by id), or -1 when it is not a member.
func (r *Ring) Index(id string) int32 {
	if i, ok := r.index(id); ok {
		return int32(i)
	}
	return -1
}

// OwnerIndex returns the position in the ring's members of partition p's
// owner, or -1 when the ring is empty or p is out of range: with Index,
// "does id own p" is one comparison, with no Member copied out.
func (r *Ring) OwnerIndex(p uint32) int32 {
	if uint(p) >= uint(len(r.owner)) {
		return -1
	}
	return r.owner[p]
}

// OwnerOfKey returns the partition of keyHash and its owner; ok is false if
// the ring is empty.
func (r *Ring) OwnerOfKey(keyHash uint64) (p uint32, m Member, ok bool) {
	p = uint32(keyHash % r.nparts)
	m, ok = r.lookup(r.owner, p)
	return p, m, ok
}

// PartitionsOf returns the partitions owned by the member id, sorted; nil if
// it owns none or is not a member.
func (r *Ring) PartitionsOf(id string) []uint32 {
	i, ok := r.index(id)
	if !ok || r.counts[i] == 0 {
		return nil
	}
	ps := make([]uint32, 0, r.counts[i])
	for p, o := range r.owner {
		if o == int32(i) {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// Counts returns the number of partitions owned by each member, by ID. Every
// member is present, with 0 if it owns nothing.
func (r *Ring) Counts() map[string]int {
	m := make(map[string]int, len(r.members))
	for i, mem := range r.members {
		m[mem.ID] = r.counts[i]
	}
	return m
}
