package cputime

import "testing"

func TestProcessGrowsWithWork(t *testing.T) {
	before := Process()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	if after := Process(); after <= before && x != 0 {
		t.Fatalf("CPU time %v then %v after a busy loop", before, after)
	}
}
