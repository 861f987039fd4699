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
}
