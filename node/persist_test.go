package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/ringlimit/ringlimit/transport"
)

// The bucket file round trip: what the last member serves is saved (and
// it stops serving it), then read back as backup copies; a damaged file is
// refused whole, set aside as .bad, and nothing of it is taken.
func TestBucketFile(t *testing.T) {
	dir := t.TempDir()
	// In a bubble: the check after the save waits (virtual time) for a
	// partition that does not come back.
	synctest.Test(t, func(t *testing.T) { checkBucketFile(t, dir) })
}

func checkBucketFile(t *testing.T, dir string) {
	a, v := testOwner(t, 1, "a")
	h, p := partOf(v, "a")
	c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 2}
	if r := handle(a, 1, c).Results[0]; !r.Allowed {
		t.Fatalf("spend: %+v", r)
	}
	n, err := a.saveBuckets(dir)
	if err != nil || n != 1 {
		t.Fatalf("saved %d partitions (err %v), want 1", n, err)
	}
	if r := handle(a, 1, c).Results[0]; r.Status != transport.StatusUnavailable {
		t.Fatalf("a check after the save: %v, want UNAVAILABLE (no spend after the state was written)", r.Status)
	}

	b, _ := testOwner(t, 1, "a")
	if n, err := b.loadBuckets(dir); err != nil || n != 1 {
		t.Fatalf("loaded %d partitions (err %v), want 1", n, err)
	}
	if b.BackupTable().PartitionLen(p) != 1 {
		t.Fatalf("backup copy of %d holds %d states, want 1", p, b.BackupTable().PartitionLen(p))
	}
	if _, err := os.Stat(filepath.Join(dir, bucketFile)); !os.IsNotExist(err) {
		t.Fatalf("file still there after loading: %v", err)
	}

	if _, err := a.saveBuckets(dir); err != nil { // nothing served any more: no file
		t.Fatal(err)
	}
	d, _ := testOwner(t, 1, "a")
	handle(d, 1, c)
	if _, err := d.saveBuckets(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, bucketFile)
	good, _ := os.ReadFile(path)
	if err := os.WriteFile(path, good[:len(good)-3], 0o600); err != nil {
		t.Fatal(err)
	}
	e, _ := testOwner(t, 1, "a")
	if n, err := e.loadBuckets(dir); err == nil || n != 0 || !strings.Contains(err.Error(), ".bad") {
		t.Fatalf("damaged file: %d loaded, err %v; want an error naming the .bad copy", n, err)
	}
	if e.BackupTable().Len() != 0 {
		t.Fatal("part of a damaged file was taken")
	}
	if _, err := os.Stat(path + ".bad"); err != nil {
		t.Fatalf("damaged file not set aside: %v", err)
	}

	// Two partitions, the second one's stream damaged (its framing
	// intact): the first, already taken, is dropped again.
	f, _ := testOwner(t, 1, "a")
	handle(f, 1, c)
	for h2 := h + 1; ; h2++ {
		if p2 := v.Ring.Partition(h2); p2 != p {
			if o, _ := v.Ring.Owner(p2); o.ID == "a" {
				handle(f, 1, transport.Check{Rule: "r", KeyHash: h2, Partition: p2, Cost: 1})
				break
			}
		}
	}
	if n, err := f.saveBuckets(dir); err != nil || n != 2 {
		t.Fatalf("saved %d partitions (err %v), want 2", n, err)
	}
	two, _ := os.ReadFile(path)
	last := strings.LastIndex(string(two), "RLP1")
	two[last] = 'X'
	if err := os.WriteFile(path, two, 0o600); err != nil {
		t.Fatal(err)
	}
	g, _ := testOwner(t, 1, "a")
	if n, err := g.loadBuckets(dir); err == nil || n != 0 {
		t.Fatalf("second stream damaged: %d loaded, err %v; want an error", n, err)
	}
	if g.BackupTable().Len() != 0 {
		t.Fatal("the first partition of a file whose second is damaged was kept")
	}
}
