package fsm

import (
	"errors"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

// FuzzApply feeds arbitrary bytes as a log entry to a fresh FSM and to an
// initialized one with members and rules: Apply never panics, answers nil
// or an error of this package (or of rules), leaves the state untouched
// when it fails, reaches only states a snapshot can hold, and does the
// same on a twin FSM.
func FuzzApply(f *testing.F) {
	m := must(f)
	for _, seed := range [][]byte{
		m(Init(testConfig)),
		m(PutRules([]limiter.Rule{ruleLogin, ruleAPI})),
		m(PutRules(nil)),
		m(AddMember(member("n1", "8081"))),
		m(AddMember(member("n4", "8081"))),
		m(RemoveMember("n2")),
		m(SetMemberState("n1", Dead)),
		[]byte(`{"v":1,"op":"put_rules","rules":[{"name":"x","algorithm":"gcra","limit":0,"period_ns":1000000000}]}`),
		[]byte(`{"v":1,"op":"set_member_state","id":"n1","state":"bogus"}`),
		[]byte(`{"v":2,"op":"init"}`),
		[]byte(`{"v":1,"op":"init","config":{"partitions":1e99}}`),
		[]byte(`{"v":1,"op":"remove_member","id":"n1"} x`),
		[]byte("null"),
		[]byte(""),
		[]byte("\xff\xfe"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, mk := range []func() *FSM{New, func() *FSM { return populated(t) }} {
			a, b := mk(), mk()
			before := a.State()
			ra := a.Apply(&raft.Log{Index: 1000, Data: data})
			rb := b.Apply(&raft.Log{Index: 1000, Data: data})
			if errText(ra) != errText(rb) || !reflect.DeepEqual(a.State(), b.State()) {
				t.Fatalf("twins differ: %v / %v", ra, rb)
			}
			if ra != nil {
				err, ok := ra.(error)
				if !ok || err == nil {
					t.Fatalf("response %T %v, want error", ra, ra)
				}
				known := []error{ErrMalformed, ErrVersion, ErrUnknownOp, ErrInvalid, ErrInitialized, ErrNotInitialized, ErrUnknownMember, rules.ErrInvalid}
				if !errorsIsAny(err, known) {
					t.Fatalf("response %v wraps no sentinel", err)
				}
				if a.State() != before {
					t.Fatalf("failed command %v changed the state", err)
				}
			}
			if err := checkState(a.State()); err != nil {
				t.Fatalf("state breaks an invariant: %v", err)
			}
		}
	})
}

func errorsIsAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
