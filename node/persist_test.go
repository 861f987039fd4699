package node

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
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

// spentOwner is testOwner "a" alone at epoch 1, with the budget of one
// key spent by check c (cost 2 of the limit 2).
func spentOwner(t *testing.T) (*Owner, transport.Check) { return spentOwnerOf(t, "a") }

// spentOwnerOf is spentOwner in a ring of members ("a" among them): the
// more members, the fewer partitions "a" owns, and the smaller its
// bucket file (every partition it owns is written, empty ones too).
func spentOwnerOf(t testing.TB, members ...string) (*Owner, transport.Check) {
	t.Helper()
	a, v := testOwner(t, 1, members...)
	h, p := partOf(v, "a")
	c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 2}
	if r := handle(a, 1, c).Results[0]; !r.Allowed {
		t.Fatalf("spend: %+v", r)
	}
	return a, c
}

func checkBucketFile(t *testing.T, dir string) {
	a, c := spentOwner(t)
	h, p := c.KeyHash, c.Partition
	n, err := a.saveBuckets(dir, nil)
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

	if _, err := a.saveBuckets(dir, nil); err != nil { // nothing served any more: no file
		t.Fatal(err)
	}
	d, _ := testOwner(t, 1, "a")
	handle(d, 1, c)
	if _, err := d.saveBuckets(dir, nil); err != nil {
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
	f, v := testOwner(t, 1, "a")
	handle(f, 1, c)
	for h2 := h + 1; ; h2++ {
		if p2 := v.Ring.Partition(h2); p2 != p {
			if o, _ := v.Ring.Owner(p2); o.ID == "a" {
				handle(f, 1, transport.Check{Rule: "r", KeyHash: h2, Partition: p2, Cost: 1})
				break
			}
		}
	}
	if n, err := f.saveBuckets(dir, nil); err != nil || n != 2 {
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

// The member that stopped last restarts with every budget in its bucket
// file, while its first ring gives some partitions to another member: it
// hands those off, and the owner, awaiting them, serves them spent, not
// afresh; one it owns again is merged with the hand-off it awaits.
func TestLoadedBucketsGoToTheirOwners(t *testing.T) {
	dir := t.TempDir()
	a, v1 := testOwner(t, 1, "a") // the last member: it owns everything
	v2 := testView(t, 2, "a", "b")
	hb, pb := partOf(v2, "b")
	ha, pa := partOf(v2, "a")
	toB := transport.Check{Rule: "r", KeyHash: hb, Partition: pb, Cost: 2}
	toA := transport.Check{Rule: "r", KeyHash: ha, Partition: pa, Cost: 2}
	for _, c := range []transport.Check{toB, toA} {
		if r := handle(a, v1.Epoch(), c).Results[0]; !r.Allowed {
			t.Fatalf("spend: %+v", r)
		}
	}
	if _, err := a.saveBuckets(dir, nil); err != nil {
		t.Fatal(err)
	}

	a2, b := newOwner(t, "a"), newOwner(t, "b")
	if n, err := a2.loadBuckets(dir); err != nil || n != 2 {
		t.Fatalf("loaded %d partitions (err %v), want 2", n, err)
	}
	// Both start again; b's first ring names it too: it awaits its partitions.
	a2.Apply(v2, PlanMoves(nil, v2.Ring, "a", allAlive, true, false))
	b.Apply(v2, PlanMoves(nil, v2.Ring, "b", allAlive, false, false))
	out := holding(t, a2.handOffLoaded(v2))
	if len(out) != 1 || out[0].To.ID != "b" || out[0].Part.Partition != pb {
		t.Fatalf("hand-offs of the loaded buckets holding states: %+v, want partition %d to b", out, pb)
	}
	if a2.handOffLoaded(v2) != nil {
		t.Fatal("the loaded buckets are handed off twice")
	}
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a", Parts: []transport.PushPart{a2.sendable(out[0], a2.now())}}
	ack := transport.PushAck{Status: make([]transport.PushStatus, 1)}
	b.HandlePush(t.Context(), push, &ack)
	if r := handle(b, 2, toB).Results[0]; ack.Status[0] != transport.PushOK || r.Status != transport.StatusOK || r.Allowed {
		t.Fatalf("at b after the hand-off (%v): %+v, want denied (2 of 2 spent before the stop)", ack.Status[0], r)
	}
	// a awaits its own partition from b (who never held it: Lost), and
	// promotes its loaded copy then.
	lost := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "b", Parts: []transport.PushPart{{Partition: pa, Lost: true}}}
	ack = transport.PushAck{Status: make([]transport.PushStatus, 1)}
	a2.HandlePush(t.Context(), lost, &ack)
	if r := handle(a2, 2, toA).Results[0]; r.Status != transport.StatusOK || r.Allowed {
		t.Fatalf("at a after its own partition came: %+v, want denied", r)
	}
}

// A member whose first ring lists nobody (every member down: several
// stopped together, each holding some budgets) keeps its loaded buckets
// for the first ring with an owner in it, rather than dropping them then
// and leaving the first member to join to serve them afresh.
func TestLoadedBucketsWaitForARingWithMembers(t *testing.T) {
	dir := t.TempDir()
	a, c := spentOwner(t)
	p := c.Partition
	if _, err := a.saveBuckets(dir, nil); err != nil {
		t.Fatal(err)
	}
	a2 := newOwner(t, "a")
	if n, err := a2.loadBuckets(dir); err != nil || n != 1 {
		t.Fatalf("loaded %d partitions (err %v), want 1", n, err)
	}
	empty := testView(t, 2)
	a2.Apply(empty, PlanMoves(nil, empty.Ring, "a", allAlive, true, false))
	if out := a2.handOffLoaded(empty); out != nil {
		t.Fatalf("hand-offs under a ring of nobody: %+v", out)
	}
	v3 := testView(t, 3, "b")
	a2.Apply(v3, PlanMoves(empty.Ring, v3.Ring, "a", allAlive, false, false))
	out := a2.handOffLoaded(v3)
	if held := holding(t, out); len(out) != 64 || len(held) != 1 || held[0].To.ID != "b" || held[0].Part.Partition != p {
		t.Fatalf("hand-offs once b is the owner: %d, holding states %+v; want all 64 (those a held empty as empty copies), partition %d to b with its state", len(out), held, p)
	}
}

// holding returns the hand-offs of out whose data holds states (the
// others are whole copies of partitions held empty), failing the test
// when one is Lost or does not decode.
func holding(t *testing.T, out []Outgoing) []Outgoing {
	t.Helper()
	var held []Outgoing
	for _, og := range out {
		tb, err := limiter.NewTable(64)
		if err != nil {
			t.Fatal(err)
		}
		n, err := tb.Import(og.Part.Partition, og.Part.Data, 1e18)
		if og.Part.Lost || err != nil {
			t.Fatalf("hand-off of partition %d: lost %v, import: %v; want a whole copy", og.Part.Partition, og.Part.Lost, err)
		}
		if n > 0 {
			held = append(held, og)
		}
	}
	return held
}

// A loaded copy handed to another owner is kept for a while: when the
// ring gives the partition to this member before the hand-off has
// landed (the owner served it afresh, and now hands that on), it is
// merged into what comes, so the key stays spent; once this member
// neither owns nor backs up the partition, dropLoadedAway drops it.
func TestLoadedBucketsHandedOnAreKeptUntilDropped(t *testing.T) {
	dir := t.TempDir()
	a, v1 := testOwner(t, 1, "a")
	v2 := testView(t, 2, "a", "b", "c")
	var h uint64
	var p uint32
	for h = 1; ; h++ { // a key of a partition b owns and c backs up under v2
		p = v2.Ring.Partition(h)
		o, _ := v2.Ring.Owner(p)
		b, _ := v2.Ring.Backup(p)
		if o.ID == "b" && b.ID == "c" {
			break
		}
	}
	c := transport.Check{Rule: "r", KeyHash: h, Partition: p, Cost: 2}
	if r := handle(a, v1.Epoch(), c).Results[0]; !r.Allowed {
		t.Fatalf("spend: %+v", r)
	}
	if _, err := a.saveBuckets(dir, nil); err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir() // a second copy of the file, for the drop below
	if b, err := os.ReadFile(filepath.Join(dir, bucketFile)); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(dir2, bucketFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	a2 := newOwner(t, "a")
	if _, err := a2.loadBuckets(dir); err != nil {
		t.Fatal(err)
	}
	a2.Apply(v2, PlanMoves(nil, v2.Ring, "a", allAlive, true, false))
	if held := holding(t, a2.handOffLoaded(v2)); len(held) != 1 || held[0].To.ID != "b" || held[0].Part.Partition != p {
		t.Fatalf("hand-offs of the loaded buckets holding states: %+v, want partition %d to b", held, p)
	}
	kept := a2.takeLoadedAway()
	if !slices.Contains(kept, p) || a2.BackupTable().PartitionLen(p) != 1 {
		t.Fatalf("kept %v, backup copy of %d holds %d states; want the copy kept", kept, p, a2.BackupTable().PartitionLen(p))
	}
	// b and c stop before the hand-off lands: a gains p, and b hands on
	// what it served, from nothing.
	v3 := testView(t, 3, "a")
	a2.Apply(v3, PlanMoves(v2.Ring, v3.Ring, "a", allAlive, false, false))
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 3, From: "b", Parts: []transport.PushPart{{Partition: p, Data: newOwner(t, "b").table.Export(nil, p, a2.now())}}}
	ack := transport.PushAck{Status: make([]transport.PushStatus, 1)}
	a2.HandlePush(t.Context(), push, &ack)
	if r := handle(a2, 3, c).Results[0]; ack.Status[0] != transport.PushOK || r.Status != transport.StatusOK || r.Allowed {
		t.Fatalf("at a after b's empty hand-off (%v): %+v, want denied (spent before the stop)", ack.Status[0], r)
	}

	// Dropped once a neither owns nor backs it up (here: at once, under v2).
	a3 := newOwner(t, "a")
	if _, err := a3.loadBuckets(dir2); err != nil {
		t.Fatal(err)
	}
	a3.Apply(v2, PlanMoves(nil, v2.Ring, "a", allAlive, true, false))
	a3.handOffLoaded(v2)
	a3.dropLoadedAway(a3.takeLoadedAway())
	if k := a3.BackupTable().PartitionLen(p); k != 0 {
		t.Fatalf("after dropLoadedAway under a ring where b owns and c backs up %d: %d states kept", p, k)
	}
}

// A member that has saved its state for the next start refuses the
// hand-offs that come after (a ring it learnt of after the save gave it
// partitions): taken, they would be lost with the process; refused,
// their sender keeps them.
func TestSavedOwnerRefusesLaterHandoffs(t *testing.T) {
	dir := t.TempDir()
	a, v1 := testOwner(t, 1, "a", "b")
	if _, err := a.saveBuckets(dir, nil); err != nil {
		t.Fatal(err)
	}
	// b leaves after a's save: a gains b's partitions, awaiting them.
	v2 := testView(t, 2, "a")
	a.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", allAlive, false, false))
	hq, q := partOf(v1, "b")
	b := newOwner(t, "b")
	b.Apply(v1, PlanMoves(nil, v1.Ring, "b", allAlive, false, false))
	b.ExpireAwaiting(b.AwaitingParts())
	if r := handle(b, 1, transport.Check{Rule: "r", KeyHash: hq, Partition: q, Cost: 2}).Results[0]; !r.Allowed {
		t.Fatalf("spend at b: %+v", r)
	}
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "b", Parts: []transport.PushPart{{Partition: q, Data: b.table.Export(nil, q, b.now())}}}
	ack := transport.PushAck{Status: make([]transport.PushStatus, 1)}
	a.HandlePush(t.Context(), push, &ack)
	if ack.Status[0] != transport.PushRejected {
		t.Fatalf("a hand-off after the save: %v, want PushRejected (taken, it is lost with the process)", ack.Status[0])
	}
}

// Hand-offs a stopping member could not deliver are saved with what it
// serves, as they were exported, and read back as backup copies.
func TestBucketFileKeepsUndeliveredHandoffs(t *testing.T) {
	dir := t.TempDir()
	a, c := spentOwner(t)
	p := c.Partition
	now := a.now()
	og := Outgoing{Part: transport.PushPart{Partition: p, Data: a.table.Export(nil, p, now)}, At: now, src: a.table}
	lost := Outgoing{Part: transport.PushPart{Partition: p + 1, Lost: true}}

	x, _ := testOwner(t, 1, "a") // serves nothing spent: only the hand-off is saved
	if n, err := x.saveBuckets(dir, []Outgoing{og, lost}); err != nil || n != 1 {
		t.Fatalf("saved %d partitions (err %v), want the 1 undelivered hand-off that holds state", n, err)
	}
	b, _ := testOwner(t, 1, "a")
	if n, err := b.loadBuckets(dir); err != nil || n != 1 {
		t.Fatalf("loaded %d partitions (err %v), want 1", n, err)
	}
	if k := b.BackupTable().PartitionLen(p); k != 1 {
		t.Fatalf("backup copy of %d holds %d states, want the hand-off's 1", p, k)
	}
}

// A stand-in among the undelivered hand-offs (a backup copy passed on
// for a partition the member awaited when the ring moved on) is not
// saved: the state it stands in for is on its way from the member that
// served the partition, and handed again at the next start it ended the
// wait of an owner still awaiting that state, which then served the
// partition from the stand-in (an empty one: its spent keys admitted
// again, TestHolderBackWithinHandoffWaitKeepsBudgets).
func TestBucketFileKeepsNoStandIn(t *testing.T) {
	dir := t.TempDir()
	a, c := spentOwner(t)
	p := c.Partition
	now := a.now()
	standIn := Outgoing{Part: transport.PushPart{Partition: p, Data: a.table.Export(nil, p, now)}, At: now, src: a.backup, standIn: true}
	x, _ := testOwner(t, 1, "a")
	if n, err := x.saveBuckets(dir, []Outgoing{standIn}); err != nil || n != 0 {
		t.Fatalf("saved %d partitions (err %v), want none: a stand-in is not kept", n, err)
	}
	b, _ := testOwner(t, 1, "a")
	if n, err := b.loadBuckets(dir); err != nil || n != 0 {
		t.Fatalf("loaded %d partitions (err %v), want none", n, err)
	}
}

// A bucket file with any one bit flipped is refused whole (set aside as
// .bad), as a truncated one is; one of the release before (no checksum)
// still loads; one exported later than the loader's clock says it is now
// (a clock stepped back) is loaded as of now, not years into the future.
// Was: no checksum, so 71 of 456 single-bit flips (the export time, the
// keys) loaded silently and lost the spent budget, and a future export
// time answered reset_after of 20 years.
func TestBucketFileDamageAndClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		// Eight members: a file of about 8 partitions, whose every bit
		// is flipped below.
		a, c := spentOwnerOf(t, "a", "b", "c", "d", "e", "f", "g", "h")
		if _, err := a.saveBuckets(dir, nil); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, bucketFile)
		good, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		load := func(b []byte) (*Owner, int, error) {
			t.Helper()
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			o, _ := testOwner(t, 1, "a")
			n, err := o.loadBuckets(dir)
			return o, n, err
		}
		for i := range len(good) * 8 {
			b := bytes.Clone(good)
			b[i/8] ^= 1 << (i % 8)
			if o, n, err := load(b); err == nil || n != 0 || o.BackupTable().Len() != 0 {
				t.Fatalf("bit %d flipped: %d partitions loaded, err %v; want refused whole", i, n, err)
			}
		}
		// Version 1: no checksum.
		v1 := append([]byte(bucketMagicV1), good[len(bucketMagic):len(good)-4]...)
		if o, n, err := load(v1); err != nil || n != 1 || o.BackupTable().PartitionLen(c.Partition) != 1 {
			t.Fatalf("a version 1 file: %d loaded, err %v; want its partition", n, err)
		}
		// Exported an hour after now: taken as exported now.
		future := bytes.Clone(good[:len(good)-4])
		at := int64(binary.LittleEndian.Uint64(future[len(bucketMagic):]))
		binary.LittleEndian.PutUint64(future[len(bucketMagic):], uint64(at+int64(time.Hour)))
		future = binary.LittleEndian.AppendUint32(future, crc32.Checksum(future, castagnoli))
		o, n, err := load(future)
		if err != nil || n != 1 {
			t.Fatalf("a file from the future: %d loaded, err %v", n, err)
		}
		o.promote(c.Partition, o.now())
		q := c
		q.Cost = 0
		if r := handle(o, 1, q).Results[0]; r.Status != transport.StatusOK || r.Remaining != 0 || r.ResetAfter > time.Minute {
			t.Fatalf("the key from a file exported in the future: %+v; want spent, back to full within the rule's period", r)
		}
	})
}

// A bucket file that cannot be read (here a directory in its place; an
// unreadable file alike) is set aside, so that the next stop's save does
// not replace it, and an earlier .bad is never overwritten. Was: left in
// place and replaced at the next stop, its budgets gone for good.
func TestUnreadableBucketFileIsSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, bucketFile)
	if err := os.WriteFile(path+".bad", []byte("an earlier one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	o, _ := testOwner(t, 1, "a")
	if n, err := o.loadBuckets(dir); err == nil || n != 0 || !strings.Contains(err.Error(), bucketFile+".bad.1") {
		t.Fatalf("loadBuckets = %d, %v; want an error naming %s.bad.1", n, err, bucketFile)
	}
	if fi, err := os.Stat(path + ".bad.1"); err != nil || !fi.IsDir() {
		t.Fatalf("the unreadable one is not at .bad.1: %v", err)
	}
	if b, err := os.ReadFile(path + ".bad"); err != nil || string(b) != "an earlier one" {
		t.Fatalf("the earlier .bad was touched: %q, %v", b, err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still in place: %v", bucketFile, err)
	}
}

// writeFileAtomic replaces a file whole and leaves no temporary file; a
// write that fails (a directory where the file goes) leaves the old
// content and no temporary file either.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	for _, content := range []string{"first\n", "second, longer than the first\n", "3\n"} {
		if err := writeFileAtomic(dir, "f", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != content {
			t.Fatalf("after writing %q: %q, %v", content, b, err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "d", "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(dir, "d", []byte("x"), 0o600); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "d,f" {
		t.Fatalf("dir holds %v, want [d f] (no temporary file left)", names)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "3\n" {
		t.Fatalf("f = %q after the failed write of another file", b)
	}
}

// The last member's bucket file lists its idle partitions too (no
// states). Restarted listed active (Moves.resume) in a ring of two, it
// serves them at once from the file, as it does those with states, and
// hands the other member's share off as parts with data: AwaitCopies
// does not take them for a dead owner's partitions it holds nothing of.
// It did: they awaited copies that never come (counted served from
// nothing after 3 s), and those given away went as Lost parts, which
// their new owner, holding nothing either, awaited for its whole
// hand-off wait (an hour with --dead-after 1h).
func TestLoadedIdlePartitionsAreServedAtOnce(t *testing.T) {
	dir := t.TempDir()
	a, _ := spentOwner(t)
	if _, err := a.saveBuckets(dir, nil); err != nil {
		t.Fatal(err)
	}
	a2 := newOwner(t, "a")
	if _, err := a2.loadBuckets(dir); err != nil {
		t.Fatal(err)
	}
	v2, v3 := testView(t, 2, "a", "c"), testView(t, 3, "a", "b", "c")
	m := PlanMoves(nil, v2.Ring, "a", allAlive, true, false)
	m.resume(a2.loaded)
	a2.AwaitCopies(&m, v2.Ring)
	if c := m.awaitingCopies(); len(c) > 0 {
		t.Fatalf("partitions of the bucket file awaiting copies: %v", c)
	}
	a2.Apply(v2, m)
	a2.handOffLoaded(v2)
	if aw := a2.AwaitingParts(); len(aw) > 0 {
		t.Fatalf("partitions of the bucket file awaiting at the restart: %v", aw)
	}
	for _, og := range a2.Apply(v3, PlanMoves(v2.Ring, v3.Ring, "a", allAlive, false, false)) {
		if og.Part.Lost {
			t.Errorf("partition %d handed to %s as Lost: it was served from the file", og.Part.Partition, og.To.ID)
		}
	}
}
