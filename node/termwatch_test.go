package node

import (
	"maps"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/ring"
)

// The watch keeps, per peer, the latest call it answered at the call's
// term (a late answer to an older call moves nothing back), and whether a
// call of a term was answered at a newer one.
func TestTermWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	_, w := watchTerms(raft.Transport(nil))
	type at = map[string]time.Time
	for i, st := range []struct {
		peer           string
		term, answered uint64
		sent           time.Time
		askTerm        uint64
		want           at
		wantSuperseded bool
	}{
		{"b", 5, 5, ms(100), 5, at{"b": ms(100)}, false},
		{"c", 5, 5, ms(120), 5, at{"b": ms(100), "c": ms(120)}, false},
		{"b", 5, 5, ms(50), 5, at{"b": ms(100), "c": ms(120)}, false}, // a late answer to an older call
		{"b", 5, 5, ms(200), 5, at{"b": ms(200), "c": ms(120)}, false},
		{"c", 4, 4, ms(300), 5, at{"b": ms(200), "c": ms(120)}, false}, // a call of an older term changes nothing
		{"d", 5, 9, ms(310), 5, at{"b": ms(200), "c": ms(120)}, true},  // d follows a newer leader
		{"b", 6, 6, ms(400), 6, at{"b": ms(400)}, false},               // leading again, at term 6
	} {
		w.note(st.peer, st.term, st.answered, st.sent)
		got := at{}
		if sup := w.acks(st.askTerm, got); !maps.Equal(got, st.want) || sup != st.wantSuperseded {
			t.Errorf("step %d: after note(%s, %d, %d, %v): acks(%d) = %v %v, want %v %v",
				i, st.peer, st.term, st.answered, st.sent.Sub(t0), st.askTerm, got, sup, st.want, st.wantSuperseded)
		}
	}
}

// Raft offers pre-vote only when its transport does, by type: the watch
// must neither hide it nor claim it.
func TestWatchTermsKeepsPreVote(t *testing.T) {
	_, inmem := raft.NewInmemTransport("a")
	if got, _ := watchTerms(inmem); !implementsPreVote(got) {
		t.Error("the watch hides the in-memory transport's pre-vote")
	}
	if got, _ := watchTerms(struct{ raft.Transport }{inmem}); implementsPreVote(got) {
		t.Error("the watch claims pre-vote for a transport without it")
	}
}

func implementsPreVote(t raft.Transport) bool {
	_, ok := t.(raft.WithPreVote)
	return ok
}

// DeadAfter is at least RaftTimeout: the leader's lease, DeadAfter/4,
// counts Raft heartbeats, which come up to RaftTimeout/5 apart.
func TestDeadAfterCoversRaftHeartbeats(t *testing.T) {
	for _, tc := range []struct {
		dead, raft time.Duration
		ok         bool
	}{
		{0, time.Second, true}, // the default, 5s
		{time.Second, time.Second, true},
		{2 * time.Second, 200 * time.Millisecond, true},
		{500 * time.Millisecond, time.Second, false},
	} {
		cfg := Config{ID: "a", HTTPAddr: "h:1", RaftAdvertise: "r:1", PeerAddr: "p:1", DataDir: "d",
			Forward: nopForwarder{}, DataPlane: nopDataPlane{}, Ring: ring.DefaultConfig(),
			DeadAfter: tc.dead, RaftTimeout: tc.raft}
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate with dead-after %v, raft timeout %v: %v, want ok %v", tc.dead, tc.raft, err, tc.ok)
		}
	}
}

// closeCounter counts Close calls; plain offers no pre-vote, preVote
// does (the in-memory transport's).
type closeCounter struct{ closed int }

func (c *closeCounter) Close() error { c.closed++; return nil }

type plainClosing struct {
	raft.Transport
	*closeCounter
}

type preVoteClosing struct {
	*raft.InmemTransport
	*closeCounter
}

func (p preVoteClosing) Close() error { return p.closeCounter.Close() }

// The wrappers of Raft's transport pass Close on, with pre-vote or
// without: Raft closes its transport only through them.
func TestTransportWrappersPassCloseOn(t *testing.T) {
	_, inmem := raft.NewInmemTransport("a")
	plain, pv := &closeCounter{}, &closeCounter{}
	for _, tc := range []struct {
		inner   raft.Transport
		c       *closeCounter
		preVote bool
	}{
		{plainClosing{inmem, plain}, plain, false},
		{preVoteClosing{inmem, pv}, pv, true},
	} {
		w, _ := watchTerms(tc.inner)
		got := retryReplication(w, time.Second, nil, nil)
		if implementsPreVote(got) != tc.preVote {
			t.Fatalf("pre-vote %v through the wrappers, want %v", implementsPreVote(got), tc.preVote)
		}
		c, ok := got.(raft.WithClose)
		if !ok {
			t.Fatalf("the wrapped transport (pre-vote %v) offers no Close", tc.preVote)
		}
		if err := c.Close(); err != nil || tc.c.closed != 1 {
			t.Fatalf("Close (pre-vote %v): %v, the transport closed %d times; want once", tc.preVote, err, tc.c.closed)
		}
	}
}
