package transport

import (
	"testing"
	"time"
)

// fuzzLimits are small so that the fuzzer reaches the limit checks.
var fuzzLimits = Limits{MaxFrameSize: 1 << 16, MaxChecks: 512}

// FuzzDecodeBatchRequest: no input panics; an input that decodes
// re-encodes to a frame that decodes to the same request.
func FuzzDecodeBatchRequest(f *testing.F) {
	f.Add(AppendBatchRequest(nil, 1, 0, &BatchRequest{}))
	f.Add(AppendBatchRequest(nil, 2, time.Second, batchOf(3, "login")))
	f.Add(AppendBatchRequest(nil, 3, time.Millisecond, batchOf(40, "a", "b", "c", "")))
	f.Add(AppendBatchRequest(nil, 4, 1, batchOf(20, "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8",
		"r9", "r10", "r11", "r12", "r13", "r14", "r15", "r16", "r17", "r18", "r19")))
	f.Add(AppendBatchResponse(nil, 5, &BatchResponse{Results: make([]Result, 2)}))
	f.Add([]byte{})
	// Version 2: inline rules in the name table, mixed with named rules.
	inline := batchOf(6, "rls:a#0", "default", "rls:b#1")
	for i := range inline.Checks {
		if i%3 != 1 {
			inline.Checks[i].Inline = InlineRule{Algorithm: uint8(1 + i%6), FailureMode: uint8(i % 2), Limit: int64(10 * (i + 1)), Period: time.Second, Burst: int64(i)}
		}
	}
	f.Add(AppendBatchRequest(nil, 6, time.Millisecond, inline))
	// Version 5: groups of joined checks, with and without inline rules
	// and a rules version.
	joined := batchOf(7, "a", "b")
	for _, i := range []int{1, 2, 5} {
		joined.Checks[i].Joined = true
	}
	f.Add(AppendBatchRequest(nil, 7, time.Millisecond, joined))
	joined.RulesVersion = 12
	f.Add(AppendBatchRequest(nil, 8, time.Millisecond, joined))
	inline.Checks[1].Joined, inline.RulesVersion = true, 3
	f.Add(AppendBatchRequest(nil, 9, time.Millisecond, inline))
	var reused BatchRequest // exercises capacity and intern-table reuse
	f.Fuzz(func(t *testing.T, frame []byte) {
		id, deadline, err := fuzzLimits.DecodeBatchRequest(frame, &reused)
		if err != nil {
			return
		}
		var fresh BatchRequest
		if _, _, err := fuzzLimits.DecodeBatchRequest(frame, &fresh); err != nil {
			t.Fatalf("decodes into a reused request but not a fresh one: %v", err)
		}
		if fresh.Epoch != reused.Epoch || !sameChecks(fresh.Checks, reused.Checks) {
			t.Fatalf("fresh decode %+v != reused decode %+v", fresh, reused)
		}
		again := AppendBatchRequest(nil, id, deadline, &fresh)
		var got BatchRequest
		id2, deadline2, err := fuzzLimits.DecodeBatchRequest(again, &got)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if id2 != id || deadline2 != deadline || got.Epoch != fresh.Epoch || got.RulesVersion != fresh.RulesVersion || !sameChecks(got.Checks, fresh.Checks) {
			t.Fatalf("round trip changed the request: %+v != %+v", got, fresh)
		}
		if len(again) > len(frame) {
			t.Fatalf("canonical encoding (%d bytes) longer than the input (%d)", len(again), len(frame))
		}
	})
}

// FuzzDecodeBatchResponse: as FuzzDecodeBatchRequest, for responses; error
// frames are decoded too.
func FuzzDecodeBatchResponse(f *testing.F) {
	f.Add(AppendBatchResponse(nil, 1, &BatchResponse{}))
	f.Add(AppendBatchResponse(nil, 2, &BatchResponse{Epoch: 9, Results: []Result{
		{Status: StatusOK, Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second},
		{Status: StatusNotOwner},
		{Status: StatusOK, Limit: 10, Remaining: -1, RetryAfter: time.Minute, Delay: -5},
	}}))
	f.Add(AppendError(nil, 3, CodeMalformed, "bad"))
	f.Add(AppendBatchRequest(nil, 4, 0, batchOf(2, "x")))
	var reused BatchResponse
	f.Fuzz(func(t *testing.T, frame []byte) {
		if id, rerr, err := fuzzLimits.DecodeError(frame); err == nil {
			_, got, err := fuzzLimits.DecodeError(AppendError(nil, id, rerr.Code, rerr.Message))
			if err != nil || *got != *rerr {
				t.Fatalf("error frame %+v round-trips to %+v, %v", rerr, got, err)
			}
		}
		id, err := fuzzLimits.DecodeBatchResponse(frame, &reused)
		if err != nil {
			return
		}
		again := AppendBatchResponse(nil, id, &reused)
		var got BatchResponse
		id2, err := fuzzLimits.DecodeBatchResponse(again, &got)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if id2 != id || got.Epoch != reused.Epoch || !sameResults(got.Results, reused.Results) {
			t.Fatalf("round trip changed the response: %+v != %+v", got, reused)
		}
	})
}
