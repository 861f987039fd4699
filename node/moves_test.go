package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// lateHandoff is a partition p of key h that a (its owner at epoch 1,
// backed up by b) hands to b at epoch 2, when a leaves gracefully; b
// learns of epoch 2 first, and its copy of p is behind a's state.
type lateHandoff struct {
	a, b   *Owner
	v1, v2 *view.View
	clock  *atomic.Int64 // both owners' clock, Unix ns
	h      uint64
	p      uint32
}

// newLateHandoff returns a and b serving their partitions of epoch 1,
// under rules, on one clock that the test moves.
func newLateHandoff(t *testing.T, rules []limiter.Rule) *lateHandoff {
	t.Helper()
	s := &lateHandoff{clock: new(atomic.Int64)}
	s.clock.Store(1e18)
	for _, id := range []string{"a", "b"} {
		o, err := NewOwner(id, 64, s.clock.Load, nil)
		if err != nil {
			t.Fatal(err)
		}
		if id == "a" {
			s.a = o
		} else {
			s.b = o
		}
	}
	s.v1 = view.New(testRing(t, 1, "a", "b"), 9, rules, 1)
	s.v2 = view.New(testRing(t, 2, "b"), 9, rules, 1) // a is down, handing off
	for _, o := range []*Owner{s.a, s.b} {
		o.Apply(s.v1, PlanMoves(nil, s.v1.Ring, o.self, allAlive, false, false))
		o.ExpireAwaiting(o.AwaitingParts())
	}
	s.h, s.p = partBackedBy(t, s.v1, "a", "b")
	return s
}

// allAlive says every member hands its partitions off.
func allAlive(string) bool { return true }

// check sends one check of cost on the key under rule to o at epoch, and
// fails unless it is decided (StatusOK) as allowed says.
func (s *lateHandoff) check(t *testing.T, o *Owner, epoch uint64, rule string, cost uint64, allowed bool, what string) transport.Result {
	t.Helper()
	r := handle(o, epoch, transport.Check{Rule: rule, KeyHash: s.h, Partition: s.p, Cost: cost}).Results[0]
	if r.Status != transport.StatusOK || r.Allowed != allowed {
		t.Fatalf("%s: %v allowed=%v (remaining %d), want OK allowed=%v", what, r.Status, r.Allowed, r.Remaining, allowed)
	}
	return r
}

// promoteAtB moves b to epoch 2 and lets its hand-off timeout pass: b
// serves p from its copy.
func (s *lateHandoff) promoteAtB(t *testing.T) {
	t.Helper()
	s.b.Apply(s.v2, PlanMoves(s.v1.Ring, s.v2.Ring, "b", allAlive, false, false))
	if s.b.getState(s.p) != partAwaiting {
		t.Fatalf("b does not await partition %d", s.p)
	}
	s.clock.Add(int64(handoffTimeout))
	if k := s.b.ExpireAwaiting(s.b.AwaitingParts()); k == 0 {
		t.Fatal("the hand-off timeout promoted nothing")
	}
}

// handOff moves a to epoch 2 and returns its hand-off push to b.
func (s *lateHandoff) handOff(t *testing.T) *transport.Push {
	t.Helper()
	out := s.a.Apply(s.v2, PlanMoves(s.v1.Ring, s.v2.Ring, "a", allAlive, false, false))
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a"}
	for _, og := range out {
		if og.To.ID != "b" {
			t.Fatalf("hand-off to %q, want b", og.To.ID)
		}
		push.Parts = append(push.Parts, og.Part)
	}
	return push
}

// push delivers push to o and returns the status of partition p's part.
func (s *lateHandoff) push(o *Owner, push *transport.Push) transport.PushStatus {
	ack := transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
	o.HandlePush(context.Background(), push, &ack)
	for i, pt := range push.Parts {
		if pt.Partition == s.p {
			return ack.Status[i]
		}
	}
	return transport.PushRejected
}

// A hand-off that arrives after the new owner's timeout promoted its
// stale backup copy is merged into what it serves: what the old owner
// admitted after the copy still counts, so a key exhausted there stays
// denied (before, the hand-off was dropped and the key had budget again).
func TestLateHandoffIsMerged(t *testing.T) {
	for _, r := range []limiter.Rule{
		{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Hour},
		{Name: "fw", Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Hour},
		{Name: "sw", Algorithm: limiter.SlidingWindow, Limit: 3, Period: time.Hour},
		{Name: "sl", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Hour},
	} {
		t.Run(r.Algorithm.String(), func(t *testing.T) {
			s := newLateHandoff(t, []limiter.Rule{r})
			s.check(t, s.a, 1, r.Name, 1, true, "1st check at a")
			if _, sts := deliver(t, s.a, map[string]*Owner{"b": s.b}); len(sts) == 0 {
				t.Fatal("no backup push to b")
			}
			// Spent at a after the last backup push: b's copy lags.
			s.clock.Add(int64(time.Second))
			s.check(t, s.a, 1, r.Name, 1, true, "2nd check at a")
			s.check(t, s.a, 1, r.Name, 1, true, "3rd check at a")
			s.check(t, s.a, 1, r.Name, 1, false, "4th check at a")

			s.promoteAtB(t)
			// From its copy b knows of one spend: it admits one more.
			s.check(t, s.b, 2, r.Name, 1, true, "1st check at b, from the copy")

			push := s.handOff(t)
			before := s.b.HandoffsReceived()
			if st := s.push(s.b, push); st != transport.PushOK {
				t.Fatalf("late hand-off: %v, want OK", st)
			}
			if got := s.b.HandoffsReceived() - before; got != uint64(len(push.Parts)) {
				t.Errorf("ringlimit_handoff_received_partitions_total counted %d of %d parts taken", got, len(push.Parts))
			}
			if got := s.check(t, s.b, 2, r.Name, 0, false, "query at b after the hand-off"); got.Remaining != 0 {
				t.Fatalf("remaining %d after the hand-off, want 0: a spent all 3", got.Remaining)
			}
			s.check(t, s.b, 2, r.Name, 1, false, "2nd check at b")

			// Once more (a lost ack): nothing changes.
			if st := s.push(s.b, push); st != transport.PushOK {
				t.Fatalf("duplicate hand-off: %v, want OK", st)
			}
			s.check(t, s.b, 2, r.Name, 1, false, "3rd check at b")
			if !s.b.whole[s.p].Load() {
				t.Fatal("the merged partition is not sent whole to its backup")
			}
		})
	}
}

// A weighted sliding log merges entry by entry: the old owner's spends
// and the new owner's own, each while it lives in the window.
func TestLateHandoffMergesWeightedLogs(t *testing.T) {
	r := limiter.Rule{Name: "sl", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Minute}
	s := newLateHandoff(t, []limiter.Rule{r})
	s.check(t, s.a, 1, r.Name, 2, true, "a spends 2") // expires at +60s
	deliver(t, s.a, map[string]*Owner{"b": s.b})
	s.clock.Add(int64(10 * time.Second))
	s.check(t, s.a, 1, r.Name, 6, true, "a spends 6") // expires at +70s, unknown to b's copy
	s.promoteAtB(t)                                   // at +13s
	s.check(t, s.b, 2, r.Name, 5, true, "b spends 5") // expires at +73s
	if st := s.push(s.b, s.handOff(t)); st != transport.PushOK {
		t.Fatalf("late hand-off: %v, want OK", st)
	}
	// At every instant b holds the heavier of a's log (2 until +60s, 6
	// until +70s) and its own (2 until +60s, 5 until +73s): 8, then 6,
	// then 5.
	for _, step := range []struct {
		at   time.Duration // from the first spend
		want int64         // remaining
	}{{13 * time.Second, 2}, {60 * time.Second, 4}, {70 * time.Second, 5}, {73 * time.Second, 10}} {
		s.clock.Store(1e18 + int64(step.at))
		if got := s.check(t, s.b, 2, r.Name, 0, true, "query at b"); got.Remaining != step.want {
			t.Errorf("at +%v: remaining %d, want %d", step.at, got.Remaining, step.want)
		}
	}
}

// A hand-off into a partition already served changes nothing when it is
// Lost (nothing to merge) or does not decode (refused); one that arrives
// while the partition is moving out is refused as NOT_OWNER, so that its
// sender takes it to the new owner, and the table is left alone.
func TestHandoffIntoServedPartition(t *testing.T) {
	r := limiter.Rule{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Hour}
	s := newLateHandoff(t, []limiter.Rule{r})
	s.promoteAtB(t)
	s.check(t, s.b, 2, r.Name, 2, true, "b spends 2")
	for _, tt := range []struct {
		name string
		part transport.PushPart
		want transport.PushStatus
	}{
		{"lost", transport.PushPart{Partition: s.p, Lost: true}, transport.PushOK},
		{"corrupt", transport.PushPart{Partition: s.p, Data: []byte("RLP1\x02")}, transport.PushRejected},
	} {
		push := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a", Parts: []transport.PushPart{tt.part}}
		if st := s.push(s.b, push); st != tt.want {
			t.Errorf("%s hand-off: %v, want %v", tt.name, st, tt.want)
		}
		if got := s.check(t, s.b, 2, r.Name, 0, true, tt.name); got.Remaining != 1 {
			t.Errorf("after the %s hand-off: remaining %d, want 1", tt.name, got.Remaining)
		}
	}

	// b gives every partition to c; a hand-off decided under epoch 2's
	// view, which names b, finds p moved out.
	data := s.a.Table().Export(nil, s.p, s.clock.Load())
	v3 := view.New(testRing(t, 3, "c"), 9, []limiter.Rule{r}, 1)
	out := s.b.Apply(v3, PlanMoves(s.v2.Ring, v3.Ring, "b", allAlive, false, false))
	if len(out) == 0 {
		t.Fatal("b hands nothing off")
	}
	if st := s.b.takeHandoff(s.v2, &transport.PushPart{Partition: s.p, Data: data}, s.clock.Load(), &lateHandoffs{}, false); st != transport.PushNotOwner {
		t.Fatalf("hand-off into a partition moved out: %v, want NOT_OWNER", st)
	}
	if n := s.b.Table().PartitionLen(s.p); n != 0 || !s.b.Table().Fenced(s.p) || s.b.getState(s.p) != partAway {
		t.Fatalf("partition %d after the refused hand-off: %d states, fenced %v, state %d; want 0, fenced, away",
			s.p, n, s.b.Table().Fenced(s.p), s.b.getState(s.p))
	}
}

// A late hand-off racing a move of its partition out of the member that
// serves it loses nothing, whatever the interleaving: either it is merged
// before the move's export, or it is refused (NOT_OWNER) and its sender
// takes it to the new owner. The new owner denies the key a exhausted.
func TestLateHandoffRacingMoveOut(t *testing.T) {
	r := limiter.Rule{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Hour}
	for i := range 50 {
		s := newLateHandoff(t, []limiter.Rule{r})
		s.check(t, s.a, 1, r.Name, 3, true, "a spends all 3")
		s.promoteAtB(t) // from an empty copy
		push := s.handOff(t)
		v3 := view.New(testRing(t, 3, "c"), 9, []limiter.Rule{r}, 1)
		c, err := NewOwner("c", 64, s.clock.Load, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(v3, PlanMoves(s.v2.Ring, v3.Ring, "c", allAlive, false, false))

		st := make(chan transport.PushStatus)
		go func() { st <- s.push(s.b, push) }()
		out := s.b.Apply(v3, PlanMoves(s.v2.Ring, v3.Ring, "b", allAlive, false, false))
		took := <-st
		fromB := &transport.Push{Kind: transport.PushHandoff, Epoch: 3, From: "b"}
		for _, og := range out {
			fromB.Parts = append(fromB.Parts, og.Part)
		}
		if got := s.push(c, fromB); got != transport.PushOK {
			t.Fatalf("round %d: b's hand-off to c: %v", i, got)
		}
		switch took {
		case transport.PushOK: // merged at b before its export
		case transport.PushNotOwner: // a's sender readdresses it to c
			again := *push
			again.Epoch = 3
			if got := s.push(c, &again); got != transport.PushOK {
				t.Fatalf("round %d: a's hand-off readdressed to c: %v", i, got)
			}
		default:
			t.Fatalf("round %d: a's hand-off at b: %v", i, took)
		}
		if res := s.check(t, c, 3, r.Name, 1, false, "check at c"); res.Remaining != 0 {
			t.Fatalf("round %d (b answered %v): remaining %d at c, want 0", i, took, res.Remaining)
		}
	}
}

// logRecords is a slog.Handler that keeps what it is given.
type logRecords struct {
	mu  sync.Mutex
	got []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// A push of hand-offs for partitions already served is logged once, with
// counts, not once per partition (a restart's hand-back logged ~130
// lines); Lost parts, which change nothing, only at Debug.
func TestLateHandoffsLogOneLinePerPush(t *testing.T) {
	rec := &logRecords{}
	o, err := NewOwner("a", 64, func() int64 { return 1e18 }, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	v := testView(t, 1, "a")
	o.Apply(v, PlanMoves(nil, v.Ring, "a", allAlive, false, false))
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 1, From: "b"}
	for p := range uint32(5) {
		pt := transport.PushPart{Partition: p, Lost: p >= 3}
		if !pt.Lost {
			pt.Data = o.table.Export(nil, p, 1e18)
		}
		push.Parts = append(push.Parts, pt)
	}
	rec.got = nil
	ack := &transport.PushAck{Status: make([]transport.PushStatus, len(push.Parts))}
	o.HandlePush(context.Background(), push, ack)
	for i, st := range ack.Status {
		if st != transport.PushOK {
			t.Fatalf("part %d: status %d, want OK", i, st)
		}
	}
	var lines []string
	for _, r := range rec.got {
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		lines = append(lines, fmt.Sprintf("%v %s partitions=%s", r.Level, r.Message, attrs["partitions"]))
	}
	want := []string{
		"INFO late or duplicate hand-offs merged into partitions already served partitions=3",
		"DEBUG lost hand-offs for partitions already served; nothing to merge partitions=2",
	}
	if !slices.Equal(lines, want) {
		t.Fatalf("logged %q, want %q", lines, want)
	}
}

// A Lost hand-off (its sender held nothing of the partition) into a
// partition that awaits its state ends the wait only when the receiver
// has a copy of its own to serve it from; with none it would serve the
// partition from nothing, while the state may still be on its way from a
// member the sender awaited it from (a whole cluster's last member, its
// budgets in its bucket file, started after the others), so it keeps
// awaiting until its hand-off wait ends.
func TestLostHandoffIntoAwaitedPartition(t *testing.T) {
	for _, tt := range []struct {
		name   string
		backed bool // b holds a whole backup copy of p (empty: p is idle)
		want   partState
	}{
		{"no copy", false, partAwaiting},
		{"whole copy", true, partServing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := awaitingAtB(t, []limiter.Rule{{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Hour}}, tt.backed)
			lost := &transport.Push{Kind: transport.PushHandoff, Epoch: 2, From: "a", Parts: []transport.PushPart{{Partition: s.p, Lost: true}}}
			if st := s.push(s.b, lost); st != transport.PushOK {
				t.Fatalf("Lost hand-off: %v, want OK", st)
			}
			if st := s.b.getState(s.p); st != tt.want {
				t.Fatalf("partition %d after a Lost hand-off: state %d, want %d", s.p, st, tt.want)
			}
			s.clock.Add(int64(handoffTimeout))
			s.b.ExpireAwaiting([]uint32{s.p})
			if st := s.b.getState(s.p); st != partServing {
				t.Fatalf("partition %d after the hand-off timeout: state %d, want served", s.p, st)
			}
		})
	}
}

// An awaiting member that holds a whole backup copy of an idle partition
// (empty) and gives the partition up hands that copy on, not a Lost part:
// the member it goes to serves it at once (a crashed member back, whose
// mark-down and return its backup applies within lostDelay; with a Lost
// part it awaited its idle partitions for the whole hand-off wait).
func TestAwaitedIdleCopyHandedOnAsACopy(t *testing.T) {
	rules := []limiter.Rule{{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Hour}}
	s := awaitingAtB(t, rules, true)
	a2, err := NewOwner("a", 64, s.clock.Load, nil)
	if err != nil {
		t.Fatal(err)
	}
	v3 := view.New(testRing(t, 3, "a", "b"), 9, rules, 1)
	a2.Apply(v3, PlanMoves(nil, v3.Ring, "a", allAlive, true, false))
	push := &transport.Push{Kind: transport.PushHandoff, Epoch: 3, From: "b"}
	for _, og := range s.b.Apply(v3, PlanMoves(s.v2.Ring, v3.Ring, "b", allAlive, false, false)) {
		if og.Part.Partition == s.p && og.Part.Lost {
			t.Fatalf("partition %d handed on Lost; b holds a whole copy of it", s.p)
		}
		push.Parts = append(push.Parts, og.Part)
	}
	if st := s.push(a2, push); st != transport.PushOK {
		t.Fatalf("hand-off of partition %d to a: %v", s.p, st)
	}
	if st := a2.getState(s.p); st != partServing {
		t.Fatalf("partition %d at a after b's hand-off: state %d, want served", s.p, st)
	}
}

// awaitingAtB is newLateHandoff under rules, moved to epoch 2 at b, which awaits
// partition p from a; backed says a pushed b its whole (empty) copy of p
// first.
func awaitingAtB(t *testing.T, rules []limiter.Rule, backed bool) *lateHandoff {
	t.Helper()
	s := newLateHandoff(t, rules)
	if backed {
		bb := s.a.BackupPushes()["b"]
		if bb == nil {
			t.Fatal("a pushes b no backup copy")
		}
		push := &transport.Push{Kind: transport.PushBackup, Epoch: bb.Epoch, From: "a", Parts: bb.Parts}
		if st := s.push(s.b, push); st != transport.PushOK {
			t.Fatalf("backup push of partition %d: %v", s.p, st)
		}
	}
	s.b.Apply(s.v2, PlanMoves(s.v1.Ring, s.v2.Ring, "b", allAlive, false, false))
	if st := s.b.getState(s.p); st != partAwaiting {
		t.Fatalf("b does not await partition %d: state %d", s.p, st)
	}
	return s
}

// A partition that moves on while this member still awaits its hand-off
// goes on as this member's backup copy of it, marked a stand-in: the
// state is on its way from the member that served it, so a stopping
// member does not keep the copy in its bucket file (TestBucketFileKeepsNoStandIn).
// What this member served goes as itself, no stand-in.
func TestAwaitedPartitionMovingOnGoesAsStandIn(t *testing.T) {
	o := newOwner(t, "a")
	v1, v2, v3 := testView(t, 1, "b"), testView(t, 2, "a", "b"), testView(t, 3, "b")
	o.Apply(v1, PlanMoves(nil, v1.Ring, "a", allAlive, false, false))
	o.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", allAlive, false, false))
	_, awaited := partOf(v2, "a")
	served := v2.Ring.PartitionsOf("a")[0]
	if served == awaited {
		served = v2.Ring.PartitionsOf("a")[1]
	}
	o.ExpireAwaiting([]uint32{served})
	o.based[awaited].Store(true) // a whole backup copy, empty
	out := o.Apply(v3, PlanMoves(v2.Ring, v3.Ring, "a", allAlive, false, false))
	seen := 0
	for _, og := range out {
		switch og.Part.Partition {
		case awaited:
			seen++
			if og.Part.Lost || !og.standIn || og.src != o.backup {
				t.Errorf("awaited partition %d went as Lost=%v standIn=%v (from the backup table: %v), want its backup copy as a stand-in", awaited, og.Part.Lost, og.standIn, og.src == o.backup)
			}
		case served:
			seen++
			if og.standIn {
				t.Errorf("served partition %d went as a stand-in", served)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("%d of the 2 partitions handed off", seen)
	}
}

// A partition that went from this member to b and straight back awaits
// b's hand-off alone (Moves.From): once b has refused this member's own
// hand-off of it as NOT_OWNER at a view past the ring that gave it back,
// b never took its state and will not serve it, so its wait ends after
// handoffTimeout rather than a lease of b's (AwaitedFromAlone). Not for
// another member's refusal, nor one at an older view, nor a partition
// awaited across a gap of rings (someone else may have served it).
func TestAwaitedFromAlone(t *testing.T) {
	v1, v2, v3 := testView(t, 1, "a", "c"), testView(t, 2, "a", "b", "c"), testView(t, 3, "a", "c")
	var p uint32
	found := false
	for q := range uint32(64) {
		o1, _ := v1.Ring.Owner(q)
		o2, _ := v2.Ring.Owner(q)
		o3, _ := v3.Ring.Owner(q)
		if o1.ID == "a" && o2.ID == "b" && o3.ID == "a" {
			p, found = q, true
			break
		}
	}
	if !found {
		t.Fatal("no partition goes a → b → a")
	}
	m3 := PlanMoves(v2.Ring, v3.Ring, "a", allAlive, false, false)
	if m3.Gained[p] != GainAwait || m3.From[p] != "b" {
		t.Fatalf("PlanMoves: partition %d gained %v from %q, want awaited from b alone", p, m3.Gained[p], m3.From[p])
	}
	if gap := PlanMoves(testRing(t, 1, "a"), v3.Ring, "a", allAlive, false, false); gap.From[p] != "" {
		t.Fatalf("PlanMoves across a gap: partition %d awaited from %q alone, want nobody named", p, gap.From[p])
	}

	o := newOwner(t, "a")
	o.Apply(v1, PlanMoves(nil, v1.Ring, "a", allAlive, false, false))
	o.ExpireAwaiting(o.AwaitingParts())
	o.Apply(v2, PlanMoves(v1.Ring, v2.Ring, "a", allAlive, false, false))
	o.Apply(v3, m3)
	for _, tc := range []struct {
		by    string
		epoch uint64
		want  bool
	}{
		{"c", 3, false}, // not the member awaited
		{"b", 2, false}, // b's view was older than the ring that gave p back
		{"b", 3, true},
		{"b", 4, true},
	} {
		got := o.AwaitedFromAlone(tc.by, tc.epoch, []uint32{p})
		if (len(got[3]) == 1) != tc.want || len(got) > 1 {
			t.Errorf("AwaitedFromAlone(%q, %d) = %v, want partition %d under epoch 3: %v", tc.by, tc.epoch, got, p, tc.want)
		}
	}
	if k := o.ExpireAwaitingSince(3, []uint32{p}); k != 1 {
		t.Fatalf("ExpireAwaitingSince promoted %d, want partition %d", k, p)
	}
	if got := o.AwaitedFromAlone("b", 3, []uint32{p}); len(got) != 0 {
		t.Errorf("served partition %d still listed: %v", p, got)
	}
}
