package transport

import (
	"context"
	"testing"
)

// Joined checks cross a real connection (a version-5 frame) and reach
// the handler with their flags, in order.
func TestJoinedChecksReachTheHandler(t *testing.T) {
	seenc := make(chan []bool, 1)
	ts := startServer(t, "127.0.0.1:0", DefaultServerConfig(), HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
		var seen []bool
		for _, c := range req.Checks {
			seen = append(seen, c.Joined)
		}
		seenc <- seen
		echo(ctx, req, resp)
	}), nil)
	c := dial(t, ts.addr, DefaultClientConfig())
	req := &BatchRequest{Epoch: 3, RulesVersion: 5, Checks: []Check{
		{Rule: "a", KeyHash: 1, Partition: 1, Cost: 1},
		{Rule: "b", KeyHash: 1, Partition: 1, Cost: 2, Joined: true},
		{Rule: "a", KeyHash: 2, Partition: 2, Cost: 3},
		{Rule: "rls:x#0", KeyHash: 3, Partition: 3, Cost: 4, Inline: InlineRule{Algorithm: 4, Limit: 9, Period: 1e9}},
		{Rule: "rls:x#1", KeyHash: 3, Partition: 3, Cost: 4, Inline: InlineRule{Algorithm: 6, Limit: 9, Period: 6e10}, Joined: true},
	}}
	var resp BatchResponse
	if err := c.Do(testCtx(t), req, &resp); err != nil {
		t.Fatal(err)
	}
	checkEcho(t, req, &resp)
	seen := <-seenc
	want := []bool{false, true, false, false, true}
	for i := range want {
		if i >= len(seen) || seen[i] != want[i] {
			t.Fatalf("the handler saw Joined %v, want %v", seen, want)
		}
	}
}
