package ring

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func members(ids ...string) []Member {
	ms := make([]Member, len(ids))
	for i, id := range ids {
		ms[i] = Member{ID: id, HTTP: id + ":8080", Raft: id + ":7000", Peer: id + ":7001"}
	}
	return ms
}

func mustNew(t testing.TB, cfg Config, epoch uint64, ms []Member) *Ring {
	t.Helper()
	r, err := New(cfg, epoch, ms)
	if err != nil {
		t.Fatalf("New(%+v, %d, %d members) = %v", cfg, epoch, len(ms), err)
	}
	return r
}

func TestValidate(t *testing.T) {
	def := DefaultConfig()
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // "" when valid
	}{
		{"default", func(*Config) {}, ""},
		{"one partition", func(c *Config) { c.Partitions = 1 }, ""},
		{"max partitions", func(c *Config) { c.Partitions = MaxPartitions }, ""},
		{"zero partitions", func(c *Config) { c.Partitions = 0 }, "Partitions"},
		{"negative partitions", func(c *Config) { c.Partitions = -1 }, "Partitions"},
		{"too many partitions", func(c *Config) { c.Partitions = MaxPartitions + 1 }, "Partitions"},
		{"min replication", func(c *Config) { c.ReplicationFactor = 2 }, ""},
		{"max replication", func(c *Config) { c.ReplicationFactor = MaxReplicationFactor }, ""},
		{"zero replication", func(c *Config) { c.ReplicationFactor = 0 }, "ReplicationFactor"},
		{"replication 1", func(c *Config) { c.ReplicationFactor = 1 }, "ReplicationFactor"},
		{"negative replication", func(c *Config) { c.ReplicationFactor = -3 }, "ReplicationFactor"},
		{"huge replication", func(c *Config) { c.ReplicationFactor = MaxReplicationFactor + 1 }, "ReplicationFactor"},
		{"load just above 1", func(c *Config) { c.Load = math.Nextafter(1, 2) }, ""},
		{"load 1", func(c *Config) { c.Load = 1 }, "Load"},
		{"load 0", func(c *Config) { c.Load = 0 }, "Load"},
		{"load negative", func(c *Config) { c.Load = -1.5 }, "Load"},
		{"load NaN", func(c *Config) { c.Load = math.NaN() }, "Load"},
		{"load +Inf", func(c *Config) { c.Load = math.Inf(1) }, "Load"},
	}
	for _, tt := range tests {
		cfg := def
		tt.edit(&cfg)
		before := cfg
		err := cfg.Validate()
		if cfg != before && !math.IsNaN(cfg.Load) {
			t.Errorf("%s: Validate changed the config: %+v -> %+v", tt.name, before, cfg)
		}
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: %+v.Validate() = %v, want nil", tt.name, cfg, err)
			}
			continue
		}
		var ce *ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tt.field ||
			!strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: %+v.Validate() = %v, want a *ConfigError for %s", tt.name, cfg, err, tt.field)
		}
	}
}

func TestValidateReportsEveryField(t *testing.T) {
	err := Config{}.Validate()
	for _, f := range []string{"Partitions", "ReplicationFactor", "Load"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("Config{}.Validate() = %v, want it to name %s", err, f)
		}
	}
}

func TestNewErrors(t *testing.T) {
	small := Config{Partitions: 2, ReplicationFactor: 8, Load: 1.25}
	tests := []struct {
		name    string
		cfg     Config
		members []Member
		want    error
	}{
		{"invalid config", Config{}, members("a"), ErrInvalidConfig},
		{"duplicate id", DefaultConfig(), members("a", "b", "a"), ErrDuplicateMember},
		{"empty id", DefaultConfig(), members("a", ""), ErrEmptyMemberID},
		{"more members than partitions", small, members("a", "b", "c"), ErrTooManyMembers},
	}
	for _, tt := range tests {
		r, err := New(tt.cfg, 1, tt.members)
		if !errors.Is(err, tt.want) || r != nil {
			t.Errorf("%s: New = (%v, %v), want (nil, %v)", tt.name, r, err, tt.want)
		}
	}
	// As many members as partitions is accepted, but the per-member cap is
	// ceil(floor(2/2) × 1.25) = 2, so a member may end up owning nothing.
	r := mustNew(t, small, 1, members("a", "b"))
	if got := r.Counts(); !maps.Equal(got, map[string]int{"a": 0, "b": 2}) {
		t.Errorf("Counts() = %v, want a:0 b:2", got)
	}
	if got := r.PartitionsOf("a"); got != nil {
		t.Errorf("PartitionsOf(a) = %v, want nil", got)
	}
	if b, ok := r.Backup(0); !ok || b.ID != "a" {
		t.Errorf("Backup(0) = %v, %v; want a", b, ok)
	}
}

func TestEmptyRing(t *testing.T) {
	for _, ms := range [][]Member{nil, {}} {
		r := mustNew(t, DefaultConfig(), 7, ms)
		if r.Epoch() != 7 || r.Config() != DefaultConfig() || len(r.Members()) != 0 || len(r.Counts()) != 0 {
			t.Errorf("empty ring: epoch %d config %+v members %v counts %v", r.Epoch(), r.Config(), r.Members(), r.Counts())
		}
		for _, p := range []uint32{0, 1023, 1024} {
			if m, ok := r.Owner(p); ok {
				t.Errorf("Owner(%d) = %v, true; want none", p, m)
			}
			if m, ok := r.Backup(p); ok {
				t.Errorf("Backup(%d) = %v, true; want none", p, m)
			}
		}
		if p, m, ok := r.OwnerOfKey(5000); p != 5000%1024 || ok {
			t.Errorf("OwnerOfKey(5000) = %d, %v, %v; want %d, none", p, m, ok, 5000%1024)
		}
		if got := r.PartitionsOf("a"); got != nil {
			t.Errorf("PartitionsOf(a) = %v, want nil", got)
		}
		if got := Diff(nil, r); got != nil {
			t.Errorf("Diff(nil, empty) = %v, want nil", got)
		}
		if got := Diff(r, r); got != nil {
			t.Errorf("Diff(empty, empty) = %v, want nil", got)
		}
	}
}

// small is the configuration of the pinned rings below.
var small = Config{Partitions: 8, ReplicationFactor: 16, Load: 1.25}

// TestPinnedPlacement pins the exact placement of small rings. Every node of
// a cluster, including nodes running different builds during a rolling
// upgrade, must compute the same owners; if this test fails, a code or
// dependency change has moved partitions, which is a wire-compatibility
// break, not a test to update casually.
func TestPinnedPlacement(t *testing.T) {
	type row struct {
		p             uint32
		owner, backup string // "" = none
	}
	tests := []struct {
		ids  []string
		rows []row
		of   map[string][]uint32
	}{
		{
			ids:  []string{"a"},
			rows: []row{{0, "a", ""}, {3, "a", ""}, {7, "a", ""}, {8, "", ""}},
			of:   map[string][]uint32{"a": {0, 1, 2, 3, 4, 5, 6, 7}, "z": nil},
		},
		{
			ids: []string{"b", "a"}, // with two members the backup is always the other one
			rows: []row{{0, "b", "a"}, {1, "a", "b"}, {2, "b", "a"}, {3, "a", "b"},
				{4, "b", "a"}, {5, "a", "b"}, {6, "b", "a"}, {7, "a", "b"}},
			of: map[string][]uint32{"a": {1, 3, 5, 7}, "b": {0, 2, 4, 6}},
		},
		{
			ids: []string{"c", "a", "b"},
			rows: []row{{0, "b", "a"}, {1, "c", "a"}, {2, "b", "a"}, {3, "c", "a"},
				{4, "c", "b"}, {5, "a", "c"}, {6, "b", "c"}, {7, "a", "b"}, {8, "", ""}, {math.MaxUint32, "", ""}},
			of: map[string][]uint32{"a": {5, 7}, "b": {0, 2, 6}, "c": {1, 3, 4}},
		},
		{
			ids: []string{"d", "c", "b", "a"},
			rows: []row{{0, "b", "a"}, {1, "d", "c"}, {2, "b", "d"}, {3, "d", "c"},
				{4, "c", "d"}, {5, "c", "a"}, {6, "c", "b"}, {7, "a", "d"}},
			of: map[string][]uint32{"a": {7}, "b": {0, 2}, "c": {4, 5, 6}, "d": {1, 3}},
		},
	}
	for _, tt := range tests {
		r := mustNew(t, small, 1, members(tt.ids...))
		for _, row := range tt.rows {
			o, ook := r.Owner(row.p)
			b, bok := r.Backup(row.p)
			if o.ID != row.owner || ook != (row.owner != "") || b.ID != row.backup || bok != (row.backup != "") {
				t.Errorf("%v: Owner(%d), Backup(%d) = %q %v, %q %v; want %q, %q",
					tt.ids, row.p, row.p, o.ID, ook, b.ID, bok, row.owner, row.backup)
			}
			if ook && o != members(o.ID)[0] {
				t.Errorf("%v: Owner(%d) = %+v, want the full member", tt.ids, row.p, o)
			}
		}
		for id, want := range tt.of {
			if got := r.PartitionsOf(id); !slices.Equal(got, want) {
				t.Errorf("%v: PartitionsOf(%q) = %v, want %v", tt.ids, id, got, want)
			}
		}
	}
}

func TestOwnerOfKey(t *testing.T) {
	r := mustNew(t, small, 1, members("a", "b", "c"))
	tests := []struct {
		keyHash uint64
		p       uint32
		owner   string
	}{
		{0, 0, "b"},
		{1, 1, "c"},
		{13, 5, "a"},
		{math.MaxUint64, 7, "a"},
		{1<<63 + 4, 4, "c"},
	}
	for _, tt := range tests {
		p, m, ok := r.OwnerOfKey(tt.keyHash)
		if p != tt.p || m.ID != tt.owner || !ok || r.Partition(tt.keyHash) != tt.p {
			t.Errorf("OwnerOfKey(%d) = %d, %q, %v; want %d, %q, true", tt.keyHash, p, m.ID, ok, tt.p, tt.owner)
		}
	}
}

// OwnerIndex and Index name the same owner as Owner, for every partition,
// in a ring with members and in an empty one, and nothing out of range.
func TestOwnerIndex(t *testing.T) {
	for _, ms := range [][]Member{members("a", "b", "c"), nil} {
		r := mustNew(t, small, 1, ms)
		for p := uint32(0); p <= uint32(small.Partitions); p++ {
			m, ok := r.Owner(p)
			want := int32(-1)
			if ok {
				want = r.Index(m.ID)
			}
			if got := r.OwnerIndex(p); got != want || (ok && got < 0) {
				t.Errorf("%d members: OwnerIndex(%d) = %d, want %d (owner %q)", len(ms), p, got, want, m.ID)
			}
		}
		for i, m := range r.Members() {
			if got := r.Index(m.ID); got != int32(i) {
				t.Errorf("Index(%q) = %d, want %d", m.ID, got, i)
			}
		}
		if got := r.Index("nobody"); got != -1 {
			t.Errorf("Index(nobody) = %d, want -1", got)
		}
	}
}

func TestDiff(t *testing.T) {
	ring := func(ids ...string) *Ring { return mustNew(t, small, uint64(len(ids)), members(ids...)) }
	other := mustNew(t, Config{Partitions: 4, ReplicationFactor: 16, Load: 1.25}, 9, members("a"))
	tests := []struct {
		name       string
		prev, next *Ring
		want       []Move
	}{
		{"nil to nil", nil, nil, nil},
		{"same ring", ring("a", "b"), ring("b", "a"), nil},
		{"bootstrap", nil, ring("a"), []Move{{0, "", "a"}, {1, "", "a"}, {2, "", "a"}, {3, "", "a"},
			{4, "", "a"}, {5, "", "a"}, {6, "", "a"}, {7, "", "a"}}},
		{"1 to 2", ring("a"), ring("a", "b"), []Move{{0, "a", "b"}, {2, "a", "b"}, {4, "a", "b"}, {6, "a", "b"}}},
		// Bounded load moves partition 4 from b to c as well: see TestMovement.
		{"2 to 3", ring("a", "b"), ring("a", "b", "c"), []Move{{1, "a", "c"}, {3, "a", "c"}, {4, "b", "c"}}},
		{"3 to 4", ring("a", "b", "c"), ring("a", "b", "c", "d"),
			[]Move{{1, "c", "d"}, {3, "c", "d"}, {5, "a", "c"}, {6, "b", "c"}}},
		// b's partitions go to their backups (0, 2: a; 6: c). Partition 5
		// spilled to a in the 3-member ring because c already held its cap
		// of 3 (1, 3, 4); with 2 members the cap is 5, so it returns to c.
		{"remove b from 3", ring("a", "b", "c"), ring("a", "c"),
			[]Move{{0, "b", "a"}, {2, "b", "a"}, {5, "a", "c"}, {6, "b", "c"}}},
		{"to empty", ring("a", "b"), ring(), []Move{{0, "b", ""}, {1, "a", ""}, {2, "b", ""}, {3, "a", ""},
			{4, "b", ""}, {5, "a", ""}, {6, "b", ""}, {7, "a", ""}}},
		{"to nil", ring("a"), nil, []Move{{0, "a", ""}, {1, "a", ""}, {2, "a", ""}, {3, "a", ""},
			{4, "a", ""}, {5, "a", ""}, {6, "a", ""}, {7, "a", ""}}},
		{"partition count changed", ring("a"), other, []Move{{0, "", "a"}, {1, "", "a"}, {2, "", "a"}, {3, "", "a"}}},
	}
	for _, tt := range tests {
		if got := Diff(tt.prev, tt.next); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Diff = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRemovedOwnerMovesToBackup(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	full := mustNew(t, small, 1, members(ids...))
	for _, gone := range ids {
		rest := mustNew(t, small, 2, members(slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == gone })...))
		for _, p := range full.PartitionsOf(gone) {
			b, _ := full.Backup(p)
			o, _ := rest.Owner(p)
			if b.ID != o.ID {
				t.Errorf("without %s: Owner(%d) = %s, but Backup(%d) was %s", gone, p, o.ID, p, b.ID)
			}
		}
	}
}

func TestAccessorsCopy(t *testing.T) {
	r := mustNew(t, small, 3, members("c", "a", "b"))
	ms := r.Members()
	if got := []string{ms[0].ID, ms[1].ID, ms[2].ID}; !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("Members() IDs = %v, want sorted", got)
	}
	ms[0].ID = "zzz"
	if r.Members()[0].ID != "a" {
		t.Error("Members() returned the ring's own slice")
	}
	c := r.Counts()
	c["a"] = 100
	if r.Counts()["a"] != 2 {
		t.Error("Counts() returned the ring's own map")
	}
	if m, ok := r.Member("b"); !ok || m.HTTP != "b:8080" {
		t.Errorf("Member(b) = %+v, %v", m, ok)
	}
	if _, ok := r.Member("x"); ok {
		t.Error("Member(x) found a non-member")
	}
	in := members("b", "a")
	mustNew(t, small, 1, in)
	if in[0].ID != "b" {
		t.Error("New reordered the caller's slice")
	}
}

// consistent names virtual node i of member m fmt.Sprintf("%s%d", m, i); the
// name given to consistent must keep those distinct for IDs that are
// prefixes of one another.
func TestVirtualNodeNamesDistinct(t *testing.T) {
	ids := []string{"a", "a1", "a10", "a1\"0", `a\`, ""}
	seen := map[string]string{}
	for _, id := range ids {
		for i := range 128 {
			k := fmt.Sprintf("%s%d", strconv.Quote(id), i)
			if prev, dup := seen[k]; dup {
				t.Fatalf("virtual node %q of %q collides with %s", k, id, prev)
			}
			seen[k] = fmt.Sprintf("%q#%d", id, i)
		}
	}
}

func TestLookupsDoNotAllocate(t *testing.T) {
	r := mustNew(t, DefaultConfig(), 1, members("a", "b", "c"))
	var h uint64
	allocs := testing.AllocsPerRun(1000, func() {
		h += 0x9e3779b97f4a7c15
		p, _, _ := r.OwnerOfKey(h)
		r.Owner(p)
		r.Backup(p)
		r.Partition(h)
	})
	if allocs != 0 {
		t.Errorf("lookups allocate %v times per run, want 0", allocs)
	}
}
