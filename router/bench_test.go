package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/cputime"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/transport"
	"github.com/ringlimit/ringlimit/view"
)

// instantRemote answers every check allowed at once, on the sender's
// goroutine: what is left to measure is the router's own work.
type instantRemote struct{}

func (instantRemote) Do(_ context.Context, _ string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	answer(req, resp)
	return nil
}

func (instantRemote) Go(_ string, _ time.Time, req *transport.BatchRequest, resp *transport.BatchResponse, done func(error)) {
	answer(req, resp)
	done(nil)
}

func answer(req *transport.BatchRequest, resp *transport.BatchResponse) {
	resp.Epoch = req.Epoch
	resp.Results = resize(resp.Results, len(req.Checks))
	for i := range resp.Results {
		resp.Results[i] = transport.Result{Status: transport.StatusOK, Allowed: true, Limit: 10, Remaining: 9}
	}
}

// BenchmarkRouterBatch is the Go client's batched path without a
// network: a router that owns nothing (client.Ring's), calls of 100
// checks on keys drawn at random from 100,000, every owner answering at
// once. cpu-ns/check is the process's CPU per check: the router's
// validation, hashing, split per owner, batching and settling.
//
//	go test -run '^$' -bench RouterBatch -benchmem ./router/
func BenchmarkRouterBatch(b *testing.B) {
	// The keys' bytes back to back, as the side-by-side's load loop
	// lays them out.
	var all []byte
	ends := make([]int, 100_000)
	for i := range ends {
		all = strconv.AppendInt(append(all, "key-"...), int64(i), 10)
		ends[i] = len(all)
	}
	keys := make([]string, len(ends))
	for i, s, start := 0, string(all), 0; i < len(ends); i++ {
		keys[i], start = s[start:ends[i]], ends[i]
	}
	rule := limiter.Rule{Name: "bench", Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
	if err := rule.Validate(); err != nil {
		b.Fatal(err)
	}
	for _, members := range []int{1, 3} {
		b.Run(fmt.Sprintf("members=%d/batch=100", members), func(b *testing.B) {
			var ms []ring.Member
			for i := range members {
				id := fmt.Sprintf("m%d", i)
				ms = append(ms, ring.Member{ID: id, Peer: id + ":7001"})
			}
			rg, err := ring.New(ring.DefaultConfig(), 1, ms)
			if err != nil {
				b.Fatal(err)
			}
			rt, err := New(Config{}, nil, instantRemote{})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			rt.SetView(view.New(rg, 7, []limiter.Rule{rule}, 1))
			b.ReportAllocs()
			cpu := cputime.Process()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(1, 2))
				reqs := make([]Request, 100)
				out := make([]Result, len(reqs))
				for pb.Next() {
					for i := range reqs {
						reqs[i] = Request{Rule: "bench", Key: keys[rng.IntN(len(keys))], Cost: 1}
					}
					if err := rt.Check(context.Background(), reqs, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/float64(b.N*100), "cpu-ns/check")
		})
	}
}

// unavailableRemote answers every check UNAVAILABLE at once: each is
// answered by its rule's failure mode and counted degraded.
type unavailableRemote struct{}

func (unavailableRemote) Do(_ context.Context, _ string, req *transport.BatchRequest, resp *transport.BatchResponse) error {
	unavailable(req, resp)
	return nil
}

func (unavailableRemote) Go(_ string, _ time.Time, req *transport.BatchRequest, resp *transport.BatchResponse, done func(error)) {
	unavailable(req, resp)
	done(nil)
}

func unavailable(req *transport.BatchRequest, resp *transport.BatchResponse) {
	resp.Epoch = req.Epoch
	resp.Results = resize(resp.Results, len(req.Checks))
	for i := range resp.Results {
		resp.Results[i] = transport.Result{Status: transport.StatusUnavailable}
	}
}

// BenchmarkRouterDegraded is the path of an owner that cannot answer:
// batches of checks over 4 rules, every owner answering UNAVAILABLE, so
// every check is answered by its rule's failure mode and counted in
// ringlimit_degraded_total. It prices that count.
//
//	go test -run '^$' -bench RouterDegraded -benchmem ./router/
func BenchmarkRouterDegraded(b *testing.B) {
	var rules []limiter.Rule
	for i := range 4 {
		r := limiter.Rule{Name: fmt.Sprintf("rule-%d", i), Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}
		if err := r.Validate(); err != nil {
			b.Fatal(err)
		}
		rules = append(rules, r)
	}
	ms := []ring.Member{{ID: "m0", Peer: "m0:7001"}, {ID: "m1", Peer: "m1:7001"}, {ID: "m2", Peer: "m2:7001"}}
	rg, err := ring.New(ring.DefaultConfig(), 1, ms)
	if err != nil {
		b.Fatal(err)
	}
	rt, err := New(Config{}, nil, unavailableRemote{})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	rt.SetView(view.New(rg, 7, rules, 1))
	reqs := make([]Request, 100)
	for i := range reqs {
		reqs[i] = Request{Rule: rules[i%len(rules)].Name, Key: "key-" + strconv.Itoa(i), Cost: 1}
	}
	out := make([]Result, len(reqs))
	b.ReportAllocs()
	for b.Loop() {
		if err := rt.Check(context.Background(), reqs, out); err != nil {
			b.Fatal(err)
		}
	}
	if !out[0].Degraded {
		b.Fatalf("%+v: want a degraded answer", out[0])
	}
}
