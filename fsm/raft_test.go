package fsm

import (
	"io"
	"reflect"
	"testing"
	"testing/synctest"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/limiter"
)

// stores are what survives a raft restart.
type stores struct {
	logs   *raft.InmemStore
	stable *raft.InmemStore
	snaps  *raft.InmemSnapshotStore
}

// startRaft starts a single-node raft "n1" over st with f, bootstrapping
// the cluster when asked, and waits until it leads.
func startRaft(t *testing.T, st stores, f *FSM, bootstrap bool) (*raft.Raft, *raft.InmemTransport) {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = "n1"
	conf.LogOutput = io.Discard
	addr, trans := raft.NewInmemTransport("n1")
	r, err := raft.NewRaft(conf, f, st.logs, st.stable, st.snaps, trans)
	if err != nil {
		t.Fatalf("NewRaft: %v", err)
	}
	if bootstrap {
		cfg := raft.Configuration{Servers: []raft.Server{{ID: conf.LocalID, Address: addr}}}
		if err := r.BootstrapCluster(cfg).Error(); err != nil {
			t.Fatalf("BootstrapCluster: %v", err)
		}
	}
	return r, trans
}

func awaitLeader(t *testing.T, r *raft.Raft) {
	t.Helper()
	for leader := range r.LeaderCh() {
		if leader {
			return
		}
	}
}

func stop(t *testing.T, r *raft.Raft, trans *raft.InmemTransport) {
	t.Helper()
	if err := r.Shutdown().Error(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	trans.Close()
}

// TestRaftSnapshotRestore runs the FSM under a real single-node raft in a
// synctest bubble (fake clock: the election takes no wall time), takes a
// snapshot, and restarts raft over the same stores with a fresh FSM.
func TestRaftSnapshotRestore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := must(t)
		st := stores{raft.NewInmemStore(), raft.NewInmemStore(), raft.NewInmemSnapshotStore()}
		f1 := New()
		r1, trans1 := startRaft(t, st, f1, true)
		awaitLeader(t, r1)

		for _, cmd := range [][]byte{
			m(Init(testConfig)),
			m(PutRules([]limiter.Rule{ruleLogin, ruleAPI})),
			m(AddMember(member("n1", "8081"))),
		} {
			if err := Result(r1.Apply(cmd, 0)); err != nil {
				t.Fatalf("Apply: %v", err)
			}
		}
		// A rejected command reaches the caller as an error.
		if err := Result(r1.Apply(m(Init(testConfig)), 0)); err != ErrInitialized {
			t.Fatalf("second Init: %v, want ErrInitialized", err)
		}
		want := f1.State()
		if !want.Initialized || len(want.Members) != 1 || len(want.Rules) != 2 {
			t.Fatalf("state after the commands: %+v", want)
		}
		if err := r1.Snapshot().Error(); err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		stop(t, r1, trans1)

		metas, err := st.snaps.List()
		if err != nil || len(metas) != 1 {
			t.Fatalf("snapshots: %v, %v; want one", metas, err)
		}
		// NewRaft restores the snapshot before it returns, before any log
		// entry is replayed: the state comes from the snapshot.
		f2 := New()
		r2, trans2 := startRaft(t, st, f2, false)
		if got := f2.State(); !reflect.DeepEqual(got, want) {
			t.Fatalf("restored state %+v\nwant %+v", got, want)
		}
		awaitLeader(t, r2)
		if err := r2.Barrier(0).Error(); err != nil {
			t.Fatalf("Barrier: %v", err)
		}
		if got := f2.State(); !reflect.DeepEqual(got, want) {
			t.Fatalf("state after replay %+v\nwant %+v", got, want)
		}
		// And the cluster carries on.
		if err := Result(r2.Apply(m(SetMemberState("n1", Draining)), 0)); err != nil {
			t.Fatalf("Apply after restart: %v", err)
		}
		if got, _ := f2.State().Member("n1"); got.State != Draining {
			t.Fatalf("n1 = %+v, want draining", got)
		}
		stop(t, r2, trans2)
	})
}
