package ring

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/buraksezer/consistent"
	"pgregory.net/rapid"
)

// genRing draws a config and a member set small enough that every property
// (including one rebuild per member) stays fast. IDs come from a tiny
// alphabet so that prefixes ("a", "a1", "a10") are common.
func genRing(t *rapid.T) (Config, []Member) {
	cfg := Config{
		Partitions:        rapid.IntRange(1, 300).Draw(t, "partitions"),
		ReplicationFactor: rapid.IntRange(MinReplicationFactor, 40).Draw(t, "rf"),
		Load:              rapid.Float64Range(math.Nextafter(1, 2), 3).Draw(t, "load"),
	}
	n := rapid.IntRange(0, min(cfg.Partitions, 9)).Draw(t, "n")
	ids := rapid.SliceOfNDistinct(rapid.StringMatching(`[a1"0]{1,4}`), n, n, rapid.ID[string]).Draw(t, "ids")
	return cfg, members(ids...)
}

// tables returns the ring's lookup results for every partition.
func tables(r *Ring) (owners, backups []string) {
	for p := range uint32(r.Config().Partitions) {
		o, _ := r.Owner(p)
		b, _ := r.Backup(p)
		owners = append(owners, o.ID)
		backups = append(backups, b.ID)
	}
	return owners, backups
}

func TestPropInsertionOrderDoesNotMatter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, ms := genRing(t)
		perm := rapid.Permutation(ms).Draw(t, "perm")
		a, err := New(cfg, 1, ms)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		b, err := New(cfg, 1, perm)
		if err != nil {
			t.Fatalf("New(permuted): %v", err)
		}
		ao, ab := tables(a)
		bo, bb := tables(b)
		if !slices.Equal(ao, bo) || !slices.Equal(ab, bb) {
			t.Fatalf("rings differ by insertion order:\nowners  %q\n        %q\nbackups %q\n        %q", ao, bo, ab, bb)
		}
		if !slices.Equal(a.Members(), b.Members()) {
			t.Fatalf("Members() differ: %v vs %v", a.Members(), b.Members())
		}
		if d := Diff(a, b); d != nil {
			t.Fatalf("Diff of equal rings = %v", d)
		}
	})
}

// The oracle is consistent itself, fed the members in the drawn (unsorted)
// order and asked the slow way, through its locked map lookups.
func TestPropOwnersMatchConsistent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, ms := genRing(t)
		if len(ms) == 0 {
			return
		}
		r, err := New(cfg, 1, ms)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		cms := make([]consistent.Member, len(ms))
		for i, m := range ms {
			cms[i] = cmember{name: quoteID(m.ID)}
		}
		c := consistent.New(cms, consistent.Config{Hasher: xxHasher{}, PartitionCount: cfg.Partitions,
			ReplicationFactor: cfg.ReplicationFactor, Load: cfg.Load})
		for p := range cfg.Partitions {
			want := c.GetPartitionOwner(p).String()
			got, _ := r.Owner(uint32(p))
			if quoteID(got.ID) != want {
				t.Fatalf("Owner(%d) = %q, consistent says %s", p, got.ID, want)
			}
		}
	})
}

func TestPropInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, ms := genRing(t)
		r, err := New(cfg, 1, ms)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		n := len(ms)
		capacity := 0
		if n > 0 {
			capacity = int(math.Ceil(float64(cfg.Partitions/n) * cfg.Load))
		}
		counts := map[string]int{}
		for p := range uint32(cfg.Partitions) {
			o, ook := r.Owner(p)
			b, bok := r.Backup(p)
			if ook != (n > 0) || bok != (n > 1) {
				t.Fatalf("Owner(%d), Backup(%d) ok = %v, %v with %d members", p, p, ook, bok, n)
			}
			if bok && b.ID == o.ID {
				t.Fatalf("Backup(%d) = owner %q", p, o.ID)
			}
			if ook {
				counts[o.ID]++
				if !slices.Contains(r.PartitionsOf(o.ID), p) {
					t.Fatalf("PartitionsOf(%q) lacks %d", o.ID, p)
				}
			}
		}
		total := 0
		for _, m := range r.Members() {
			got := r.Counts()[m.ID]
			ps := r.PartitionsOf(m.ID)
			if got != counts[m.ID] || got != len(ps) || !slices.IsSorted(ps) {
				t.Fatalf("%q: Counts %d, owned %d, PartitionsOf %v", m.ID, got, counts[m.ID], ps)
			}
			if got > capacity {
				t.Fatalf("%q owns %d partitions, cap ceil(floor(%d/%d)×%v) = %d", m.ID, got, cfg.Partitions, n, cfg.Load, capacity)
			}
			total += got
		}
		if n > 0 && total != cfg.Partitions {
			t.Fatalf("%d of %d partitions owned", total, cfg.Partitions)
		}
	})
}

// Backup(p) is, by definition, the owner of p once p's owner is gone.
func TestPropBackupIsOwnerWithoutOwner(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, ms := genRing(t)
		r, err := New(cfg, 1, ms)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		for i, gone := range ms {
			rest, err := New(cfg, 2, slices.Delete(slices.Clone(ms), i, i+1))
			if err != nil {
				t.Fatalf("New without %q: %v", gone.ID, err)
			}
			for _, p := range r.PartitionsOf(gone.ID) {
				b, _ := r.Backup(p)
				o, _ := rest.Owner(p)
				if b.ID != o.ID {
					t.Fatalf("Backup(%d) = %q, owner without %q = %q", p, b.ID, gone.ID, o.ID)
				}
			}
		}
	})
}

func TestPropDiffTransformsOwners(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, pool := genRing(t)
		subset := func(label string) []Member {
			keep := rapid.SliceOfN(rapid.Bool(), len(pool), len(pool)).Draw(t, label)
			var ms []Member
			for i, k := range keep {
				if k {
					ms = append(ms, pool[i])
				}
			}
			return ms
		}
		prev, err := New(cfg, 1, subset("prev"))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		next, err := New(cfg, 2, subset("next"))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		owners, _ := tables(prev)
		want, _ := tables(next)
		moves := Diff(prev, next)
		if !slices.IsSortedFunc(moves, func(a, b Move) int { return int(a.Partition) - int(b.Partition) }) {
			t.Fatalf("Diff not sorted: %v", moves)
		}
		for _, m := range moves {
			if m.From == m.To || owners[m.Partition] != m.From {
				t.Fatalf("bad move %+v (owner was %q)", m, owners[m.Partition])
			}
			owners[m.Partition] = m.To
		}
		if !slices.Equal(owners, want) {
			t.Fatalf("prev + Diff = %q, next = %q", owners, want)
		}
	})
}

// New must never panic, whatever it is given; consistent's panics are either
// prevented or reported as errors.
func TestPropNewNeverPanics(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Partitions:        rapid.IntRange(-2, 40).Draw(t, "partitions"),
			ReplicationFactor: rapid.IntRange(-1, 6).Draw(t, "rf"),
			Load:              rapid.SampledFrom([]float64{math.NaN(), 0, 1, math.Nextafter(1, 2), 1.01, 1.25, 2, math.Inf(1)}).Draw(t, "load"),
		}
		ids := rapid.SliceOfN(rapid.StringMatching(`[ab]{0,2}`), 0, 12).Draw(t, "ids")
		r, err := New(cfg, 1, members(ids...))
		if (r == nil) == (err == nil) {
			t.Fatalf("New = %v, %v", r, err)
		}
		if err != nil && strings.Contains(err.Error(), ErrPlacement.Error()) {
			t.Fatalf("validation let through a config consistent rejects: %v", err)
		}
	})
}
