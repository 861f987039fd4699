package fsm

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/limiter"
	"pgregory.net/rapid"
)

// genCommand draws a log entry: mostly well-formed commands over a few ids,
// addresses and rule sets (so that they collide), sometimes a rejected one.
func genCommand(t *rapid.T) []byte {
	ids := []string{"n1", "n2", "n3", "n4"}
	hosts := []string{"10.0.0.1", "10.0.0.2", "h"}
	op := rapid.IntRange(0, 9).Draw(t, "op")
	switch op {
	case 0:
		cfg := Config{
			Partitions:        rapid.IntRange(0, 8).Draw(t, "partitions"),
			ReplicationFactor: rapid.IntRange(1, 4).Draw(t, "rf"),
			Load:              rapid.SampledFrom([]float64{1, 1.25, 2}).Draw(t, "load"),
			Seed:              rapid.Uint64Range(0, 3).Draw(t, "seed"),
		}
		return encode(initCmd{header{Version, OpInit}, toWireConfig(cfg)})
	case 1, 2:
		var rs []limiter.Rule
		for i := range rapid.IntRange(0, 3).Draw(t, "nrules") {
			rs = append(rs, limiter.Rule{
				Name:        rapid.SampledFrom([]string{"a", "b", "default", ""}).Draw(t, fmt.Sprint("name", i)),
				Algorithm:   limiter.Algorithm(rapid.IntRange(1, 6).Draw(t, "algorithm")),
				Limit:       rapid.Int64Range(-1, 3).Draw(t, "limit"),
				Period:      time.Duration(rapid.Int64Range(0, 2).Draw(t, "period")) * time.Second,
				Burst:       rapid.Int64Range(0, 4).Draw(t, "burst"),
				FailureMode: limiter.FailureMode(rapid.IntRange(0, 1).Draw(t, "mode")),
			})
		}
		return encode(putRulesCmd{header{Version, OpPutRules}, toWireRules(rs)}) // unvalidated
	case 3, 4, 5:
		h := rapid.SampledFrom(hosts).Draw(t, "host")
		return encode(addMemberCmd{header{Version, OpAddMember}, wireNewMember{
			ID: rapid.SampledFrom(ids).Draw(t, "id"), HTTP: h + ":1", Raft: h + ":2", Peer: h + ":3",
			Voter: rapid.Bool().Draw(t, "voter"),
		}})
	case 6:
		return encode(removeMemberCmd{header{Version, OpRemoveMember}, rapid.SampledFrom(ids).Draw(t, "id")})
	case 7, 8:
		s := rapid.SampledFrom([]MemberState{Active, Draining, Down, Dead, "bogus"}).Draw(t, "state")
		return encode(setMemberStateCmd{header{Version, OpSetMemberState}, rapid.SampledFrom(ids).Draw(t, "id"), s})
	default:
		return rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "junk")
	}
}

func errText(resp any) string {
	if resp == nil {
		return ""
	}
	return fmt.Sprint(resp)
}

// TestPropDeterministic: the same log applied to two FSMs gives the same
// responses and equal states; every state Apply reaches passes the
// snapshot checks; and a snapshot taken anywhere, restored into a fresh
// FSM that then applies the rest of the log, ends in the same state.
func TestPropDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		log := rapid.SliceOfN(rapid.Custom(genCommand), 1, 60).Draw(t, "log")
		// Start most logs with a valid Init so that later commands apply.
		if rapid.IntRange(0, 4).Draw(t, "init") > 0 {
			log = append([][]byte{encode(initCmd{header{Version, OpInit}, toWireConfig(testConfig)})}, log...)
		}
		cut := rapid.IntRange(0, len(log)).Draw(t, "cut")
		a, b, c := New(), New(), New()
		for i, data := range log {
			index := uint64(i + 1)
			if i == cut {
				sink := snapshotOf(t, a)
				if err := c.Restore(sink.reader()); err != nil {
					t.Fatalf("Restore at %d: %v\n%s", i, err, sink.Bytes())
				}
			}
			ra := a.Apply(&raft.Log{Index: index, Data: data})
			rb := b.Apply(&raft.Log{Index: index, Data: data})
			if errText(ra) != errText(rb) {
				t.Fatalf("entry %d %q: responses %v and %v", index, data, ra, rb)
			}
			if i >= cut {
				if rc := c.Apply(&raft.Log{Index: index, Data: data}); errText(rc) != errText(ra) {
					t.Fatalf("entry %d %q after restore: response %v, want %v", index, data, rc, ra)
				}
			}
			if err := checkState(a.State()); err != nil {
				t.Fatalf("entry %d %q: state breaks an invariant: %v\n%+v", index, data, err, a.State())
			}
		}
		if !reflect.DeepEqual(a.State(), b.State()) {
			t.Fatalf("states differ:\n%+v\n%+v", a.State(), b.State())
		}
		if cut == len(log) {
			if err := c.Restore(snapshotOf(t, a).reader()); err != nil {
				t.Fatal(err)
			}
		}
		if !reflect.DeepEqual(a.State(), c.State()) {
			t.Fatalf("snapshot at %d + replay differs:\n%+v\n%+v", cut, a.State(), c.State())
		}
	})
}
