package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// BenchmarkBackupRound is one backup round of a member owning ~33,000
// live keys of 1024 partitions with 4,600 checks since the previous round
// (a member of 3 at 700k checks/s, pushing every 20 ms): the checks, the
// export on the owner and the imports on its two backups. "whole" pushes every
// changed partition whole, as before delta backups; "delta" only its
// changed states; "none" is the checks alone. "delta" sends every rule
// set a stream names in full, as every push did before sets went by
// reference; "delta-refs" names the sets the backup took before by
// their version (BackupAnswered). rules is the number of rules in force
// (one of them checked).
func BenchmarkBackupRound(b *testing.B) {
	const keys, perRound = 100_000, 4600
	for _, nrules := range []int{1, 1000} {
		for _, mode := range []string{"none", "whole", "delta", "delta-refs"} {
			if nrules > 1 && mode == "whole" {
				continue
			}
			b.Run(fmt.Sprintf("rules=%d/%s", nrules, mode), func(b *testing.B) { backupRound(b, keys, perRound, nrules, mode) })
		}
	}
}

func backupRound(b *testing.B, keys, perRound, nrules int, mode string) {
	now := int64(1e18)
	clock := func() int64 { return now }
	a, _ := NewOwner("a", 1024, clock, nil)
	backups := map[string]*Owner{}
	for _, id := range []string{"c", "d"} {
		backups[id], _ = NewOwner(id, 1024, clock, nil)
	}
	var ms []ring.Member
	for _, id := range []string{"a", "c", "d"} {
		ms = append(ms, ring.Member{ID: id, Peer: id + ":1"})
	}
	r, err := ring.New(ring.Config{Partitions: 1024, ReplicationFactor: 32, Load: 1.25}, 1, ms)
	if err != nil {
		b.Fatal(err)
	}
	rules := []limiter.Rule{{Name: "r", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Hour}}
	for i := range nrules - 1 {
		rules = append(rules, limiter.Rule{Name: fmt.Sprintf("tenant-%04d", i), Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Hour})
	}
	v := view.New(r, 9, rules, 1)
	alive := func(string) bool { return true }
	a.Apply(v, PlanMoves(nil, v.Ring, "a", alive, false, false))
	for id, o := range backups {
		o.Apply(v, PlanMoves(nil, v.Ring, id, alive, false, false))
		o.ExpireAwaiting(o.AwaitingParts())
	}
	a.ExpireAwaiting(a.AwaitingParts())
	var mine []transport.Check
	for h := range uint64(keys) {
		kh := h * 0x9e3779b97f4a7c15
		p := r.Partition(kh)
		if o, _ := r.Owner(p); o.ID == "a" {
			mine = append(mine, transport.Check{Rule: "r", KeyHash: kh, Partition: p, Cost: 1})
		}
	}
	req := transport.BatchRequest{Epoch: 1, Checks: mine}
	resp := transport.BatchResponse{Results: make([]transport.Result, len(mine))}
	a.HandleBatch(context.Background(), &req, &resp) // every key live
	round := func() {
		for _, bb := range a.BackupPushes() {
			push := &transport.Push{Kind: transport.PushBackup, Epoch: 1, From: "a", Parts: bb.Parts}
			ack := transport.PushAck{Status: make([]transport.PushStatus, len(bb.Parts))}
			backups[bb.To.ID].HandlePush(context.Background(), push, &ack)
			if mode == "delta-refs" {
				a.BackupAnswered(bb, &ack, nil)
			}
		}
	}
	round()
	rng := rand.New(rand.NewPCG(1, 2))
	batch := transport.BatchRequest{Epoch: 1, Checks: make([]transport.Check, perRound)}
	bresp := transport.BatchResponse{Results: make([]transport.Result, perRound)}
	all := make([]transport.PushPart, 1024)
	for i := range all {
		all[i].Partition = uint32(i)
	}
	b.ResetTimer()
	for range b.N {
		now += int64(20 * time.Millisecond)
		for i := range batch.Checks {
			batch.Checks[i] = mine[rng.IntN(len(mine))]
		}
		a.HandleBatch(context.Background(), &batch, &bresp)
		switch mode {
		case "whole":
			a.MarkDirty(all)
			round()
		case "delta", "delta-refs":
			round()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perRound), "ns/check")
}
