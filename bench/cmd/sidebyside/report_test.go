package main

import (
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(append([]float64(nil), tc.in...)); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// Rounds fold into one row per load, in first-seen order: rates,
// latencies and CPU are medians, counts are sums. Ratios are the median
// of each round's ratio, not the ratio of the medians.
func TestRounds(t *testing.T) {
	rl := func(round int, cps, cpu float64) row {
		return row{System: "ringlimit", Instances: 1, Path: "Go client, 1 per call", Group: "single", Concurrency: 32, Batch: 1,
			ChecksPerSec: cps, CPUusPerCheck: cpu, P99ms: cps / 1e5, Checks: 10, Errors: 1, Round: round,
			ServerSwitchesPerCheck: cpu / 10, ServerSyscallsPerCheck: cpu / 4, LoadSwitchesPerCheck: cpu / 5, LoadSyscallsPerCheck: cpu / 2}
	}
	rd := func(round int, cps float64) row {
		return row{System: "redis", Instances: 1, Path: "EVALSHA, pipeline 1", Group: "single", Concurrency: 32, Batch: 1,
			ChecksPerSec: cps, Checks: 10, Round: round}
	}
	// Round 2 ran in a slow phase for both: its ratio is like the others.
	rows := []row{rl(1, 120e3, 4), rd(1, 50e3), rl(2, 60e3, 8), rd(2, 24e3), rl(3, 130e3, 3), rd(3, 40e3)}
	r := &report{Rounds: 3, RoundRows: rows, Rows: medianRows(rows)}
	if len(r.Rows) != 2 || r.Rows[0].System != "ringlimit" || r.Rows[1].System != "redis" {
		t.Fatalf("median rows %+v, want ringlimit then redis", r.Rows)
	}
	m := r.Rows[0]
	if m.ChecksPerSec != 120e3 || m.CPUusPerCheck != 4 || m.P99ms != 1.2 || m.Checks != 30 || m.Errors != 3 || m.Round != 0 {
		t.Errorf("ringlimit's median row %+v, want 120k/s, 4 µs, p99 1.2 ms, 30 checks, 3 errors, round 0", m)
	}
	if m.ServerSwitchesPerCheck != 0.4 || m.ServerSyscallsPerCheck != 1 || m.LoadSwitchesPerCheck != 0.8 || m.LoadSyscallsPerCheck != 2 {
		t.Errorf("ringlimit's median switches and syscalls %+v, want 0.4 / 1 and 0.8 / 2", m)
	}
	if md := r.markdown(); !strings.Contains(md, "| 0.400 / 1.000 | 0.800 / 2.000 |") {
		t.Errorf("the table lacks the median row's switches and syscalls:\n%s", md)
	}
	q, each := r.ratio("ringlimit", 1, "Go client, 1 per call", "redis", 1, "EVALSHA, pipeline 1", 32)
	if q != 2.5 || strings.Join(each, " ") != "2.4 2.5 3.2" {
		t.Errorf("ratio %v over rounds %v, want the median 2.5 of 2.4 2.5 3.2", q, each)
	}
	if !strings.Contains(r.targets(), "c=32 2.5× (rounds 2.4, 2.5, 3.2)") {
		t.Errorf("targets do not show the rounds' ratios:\n%s", r.targets())
	}
	one := &report{Rows: []row{rl(0, 120e3, 4), rd(0, 40e3)}}
	if q, each := one.ratio("ringlimit", 1, "Go client, 1 per call", "redis", 1, "EVALSHA, pipeline 1", 32); q != 3 || each != nil {
		t.Errorf("one round: ratio %v %v, want 3 and no rounds", q, each)
	}
}

// A CPU target is scored at each concurrency, and the half-of-peak p99
// from the scheduled send (what a caller at that rate waits), not from
// the send.
func TestTargetsSayWhereTheyHold(t *testing.T) {
	r := &report{Batch: 100, Rows: []row{
		{System: "ringlimit", Instances: 1, Path: "Go client, 100 per call", Concurrency: 1, CPUusPerCheck: 0.56},
		{System: "ringlimit", Instances: 1, Path: "Go client, 100 per call", Concurrency: 32, CPUusPerCheck: 0.2},
		{System: "ringlimit", Instances: 3, Path: "Go client, 1 per call, half of peak", Group: "forwarded", Concurrency: 32, Rate: 5000, P99ms: 0.7, P99SchedMs: 1.4},
	}}
	got := r.targets()
	for _, want := range []string{
		"data plane (Go client, batched), 1 member(s): ≤ 0.3 µs | c=1 0.56, c=32 0.20 µs | yes at c=32 only |",
		"| 1.400 ms from the scheduled send (0.700 ms from the send) | **no** |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("targets lack %q:\n%s", want, got)
		}
	}
}
