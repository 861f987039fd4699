package node

import (
	"context"
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
// export on the owner and the import on the backup. "whole" pushes every
// changed partition whole, as before delta backups; "delta" only its
// changed states; "none" is the checks alone.
func BenchmarkBackupRound(b *testing.B) {
	const keys, perRound = 100_000, 4600
	for _, mode := range []string{"none", "whole", "delta"} {
		b.Run(mode, func(b *testing.B) {
			now := int64(1e18)
			clock := func() int64 { return now }
			a, _ := NewOwner("a", 1024, clock, nil)
			c, _ := NewOwner("c", 1024, clock, nil)
			var ms []ring.Member
			for _, id := range []string{"a", "c", "d"} {
				ms = append(ms, ring.Member{ID: id, Peer: id + ":1"})
			}
			r, err := ring.New(ring.Config{Partitions: 1024, ReplicationFactor: 32, Load: 1.25}, 1, ms)
			if err != nil {
				b.Fatal(err)
			}
			rule := limiter.Rule{Name: "r", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Hour}
			v := view.New(r, 9, []limiter.Rule{rule}, 1)
			alive := func(string) bool { return true }
			a.Apply(v, PlanMoves(nil, v.Ring, "a", alive, false, false))
			c.Apply(v, PlanMoves(nil, v.Ring, "c", alive, false, false))
			a.ExpireAwaiting(a.AwaitingParts())
			c.ExpireAwaiting(c.AwaitingParts())
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
					if bb.To.ID != "c" {
						continue
					}
					push := &transport.Push{Kind: transport.PushBackup, Epoch: 1, From: "a", Parts: bb.Parts}
					ack := transport.PushAck{Status: make([]transport.PushStatus, len(bb.Parts))}
					c.HandlePush(context.Background(), push, &ack)
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
				case "delta":
					round()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perRound), "ns/check")
		})
	}
}
