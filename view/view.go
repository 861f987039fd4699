// Package view is what a node or a router knows of the cluster at one
// moment: the ring at its epoch, the rules in force at their version, and
// the cluster's key-hash seed — and a Cell that holds the current one and
// lets a caller wait until it reaches an epoch.
//
// A View is immutable once built; share it freely. A Cell is safe for
// concurrent use. Members (node) and stateless routers (router, client)
// use the same two types, so "wait for the ring a sender already saw" is
// written once.
package view

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// View is an immutable snapshot of the cluster. Build it with New.
type View struct {
	Ring *ring.Ring
	Seed uint64 // the cluster's secret key-hash seed
	// RulesVersion is the Raft index of the rules write in force (0 for
	// the built-in rules only).
	RulesVersion uint64
	Rules        map[string]*limiter.Rule // the rules in force, by name
	List         []limiter.Rule           // the same, default first

	salts map[string]uint64
}

// New builds a view of ring r, seed and the rules in force (list, default
// first). list is kept, not copied: do not change it afterwards.
func New(r *ring.Ring, seed uint64, list []limiter.Rule, rulesVersion uint64) *View {
	v := &View{Ring: r, Seed: seed, RulesVersion: rulesVersion, List: list,
		Rules: make(map[string]*limiter.Rule, len(list)), salts: make(map[string]uint64, len(list))}
	for i := range list {
		rule := &list[i]
		v.Rules[rule.Name] = rule
		v.salts[rule.Name] = limiter.RuleSalt(seed, rule.Name, rule.Algorithm)
	}
	return v
}

// Epoch is the ring's epoch; 0 for a nil view.
func (v *View) Epoch() uint64 {
	if v == nil || v.Ring == nil {
		return 0
	}
	return v.Ring.Epoch()
}

// Salt is the seeded salt of a rule's buckets (limiter.RuleSalt), cached;
// a rule not in the view is salted on the fly.
func (v *View) Salt(rule *limiter.Rule) uint64 {
	if s, ok := v.salts[rule.Name]; ok && v.Rules[rule.Name].Algorithm == rule.Algorithm {
		return s
	}
	return limiter.RuleSalt(v.Seed, rule.Name, rule.Algorithm)
}

// Cell holds the current View. The zero value is ready to use and holds
// no view.
type Cell struct {
	v    atomic.Pointer[View]
	mu   sync.Mutex    // guards next
	next chan struct{} // closed when Store publishes a view; nil until needed
}

// Load returns the current view, nil before the first Store.
func (c *Cell) Load() *View { return c.v.Load() }

// Store publishes v and wakes every Await.
func (c *Cell) Store(v *View) { c.Swap(v) }

// Swap is Store, returning the view it replaced (nil if none).
func (c *Cell) Swap(v *View) *View {
	old := c.v.Swap(v)
	c.wake()
	return old
}

// wake wakes every Await and Changed of the view just published.
func (c *Cell) wake() {
	c.mu.Lock()
	if c.next != nil {
		close(c.next)
		c.next = nil
	}
	c.mu.Unlock()
}

// Changed returns a channel closed by the next Store. Load after taking
// it, so a Store in between is not missed.
func (c *Cell) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = make(chan struct{})
	}
	return c.next
}

// Await waits until the view's epoch is at least epoch and its rules
// version at least rulesVersion, ctx is done, or maxWait passes, and
// returns the view then current (possibly still older, possibly nil).
func (c *Cell) Await(ctx context.Context, epoch, rulesVersion uint64, maxWait time.Duration) *View {
	reached := func(v *View) bool {
		return v != nil && v.Epoch() >= epoch && v.RulesVersion >= rulesVersion
	}
	if v := c.v.Load(); reached(v) {
		return v // the common case: no timer
	}
	t := time.NewTimer(maxWait)
	defer t.Stop()
	v, _ := c.wait(ctx, t.C, reached)
	return v
}

// AwaitFunc waits until ok holds for the current view (which may be nil)
// or ctx is done, and returns the view then current and whether ok held.
func (c *Cell) AwaitFunc(ctx context.Context, ok func(*View) bool) (*View, bool) {
	return c.wait(ctx, nil, ok)
}

// wait re-evaluates ok at every Store until it holds, ctx is done or
// timeout fires (nil: never).
func (c *Cell) wait(ctx context.Context, timeout <-chan time.Time, ok func(*View) bool) (*View, bool) {
	for {
		ch := c.Changed()
		v := c.v.Load()
		if ok(v) {
			return v, true
		}
		select {
		case <-ch:
		case <-timeout:
			return c.v.Load(), false
		case <-ctx.Done():
			return c.v.Load(), false
		}
	}
}

// Member is a cluster member as a node reports it: its state (active,
// draining, down, dead), its addresses, how many partitions it owns in
// the node's ring, whether it votes in Raft (nil: not known), and, from
// the leader only, how many milliseconds its failure detector has not
// heard from the member (nil: not reported).
type Member struct {
	ID, State        string
	HTTP, Raft, Peer string
	Partitions       int
	Voter            *bool
	SilentMS         *int64
}

// Cluster is the membership as a node reports it: the Raft leader's id
// ("" when unknown), the ring's epoch, the partition count and every
// member (whatever its state), sorted by id.
type Cluster struct {
	Leader       string
	Epoch        uint64
	Partitions   int
	RulesVersion uint64 // the Raft index of the rules write in force here (0: the built-in rules)
	Members      []Member
	// RaftOnly are the servers of this node's latest Raft configuration
	// that are no member (a leave between its two halves, a join cut
	// short), sorted; nil when there are none or it cannot be read.
	RaftOnly []string
}
