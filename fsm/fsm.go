package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/ringlimit/ringlimit/rules"
)

// MaxSnapshotSize bounds what Restore reads. A full state (MaxRules rules
// and a member per partition) is a few megabytes.
const MaxSnapshotSize = 256 << 20

// FSM is the cluster's raft.FSM. The zero value is not usable; use New.
// See the package comment for the model and concurrency rules.
type FSM struct {
	cur atomic.Pointer[current] // the current state and applied index; never nil

	mu sync.Mutex // serialises writers (Apply, Restore) and guards nothing else

	subMu sync.Mutex                 // guards subs
	subs  map[chan struct{}]struct{} // Watch subscribers
}

// current is what the FSM has applied, published as one value: a reader
// never sees a state without the index of the entry that made it, nor
// that index before its state, and both are there before any watcher is
// told (a node's leader, woken, announces the commit of what Applied
// counts).
type current struct {
	state   *State
	applied uint64 // index of the last log entry Apply returned for
}

var _ raft.FSM = (*FSM)(nil)

// New returns an FSM holding the empty, uninitialized state.
func New() *FSM {
	f := &FSM{subs: make(map[chan struct{}]struct{})}
	f.cur.Store(&current{state: &State{}})
	return f
}

// State returns the current state. It never returns nil; the result is
// immutable and stays valid (and unchanged) after later commands.
func (f *FSM) State() *State { return f.cur.Load().state }

// Watch subscribes to changes. After every command or Restore that changes
// the state, the returned channel becomes ready; notifications coalesce
// (the channel has room for one and a send never blocks), so a receiver
// must read State afresh after each one and may see several changes at
// once. The state is published before the notification. cancel
// unsubscribes; it is idempotent and does not close the channel.
func (f *FSM) Watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.subMu.Lock()
	f.subs[ch] = struct{}{}
	f.subMu.Unlock()
	return ch, func() {
		f.subMu.Lock()
		delete(f.subs, ch)
		f.subMu.Unlock()
	}
}

// publish makes c current, then tells the watchers when its state is
// new.
func (f *FSM) publish(c *current) {
	changed := c.state != f.cur.Load().state
	f.cur.Store(c)
	if !changed {
		return
	}
	f.subMu.Lock()
	defer f.subMu.Unlock()
	for ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Apply applies one committed log entry. Its response, the value of
// raft.ApplyFuture.Response, is an error when the command is rejected (the
// state is then unchanged) and nil when it is applied; Result combines it
// with the future's own error. Apply is deterministic and never panics.
func (f *FSM) Apply(l *raft.Log) any {
	if l == nil {
		return fmt.Errorf("%w: nil log", ErrMalformed)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load().state
	next, err := apply(cur, l.Index, l.Data)
	if err != nil {
		f.publish(&current{state: cur, applied: l.Index})
		return err
	}
	f.publish(&current{state: next, applied: l.Index})
	return nil
}

// Applied is the index of the last log entry Apply has finished with
// (applied or rejected); 0 before the first. It is published with the
// state that entry made, before the watchers are told of it. Raft's own
// AppliedIndex runs ahead of it: Raft counts an entry once it is handed
// to the FSM.
func (f *FSM) Applied() uint64 { return f.cur.Load().applied }

// Result waits for an applied command and returns its error: the future's
// (not leader, timeout, shutdown…) or the FSM's response. Use it as
//
//	if err := fsm.Result(r.Apply(cmd, timeout)); err != nil { … }
func Result(fut raft.ApplyFuture) error {
	if err := fut.Error(); err != nil {
		return err
	}
	if err, ok := fut.Response().(error); ok {
		return err
	}
	return nil
}

// Snapshot captures the current state; Persist writes it.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{state: f.State()}, nil
}

type snapshot struct{ state *State }

// Persist writes the snapshot as JSON and closes the sink, or cancels it on
// error.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	b, err := encodeState(s.state)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release does nothing: the captured state is immutable.
func (s *snapshot) Release() {}

// Restore replaces the whole state with the one in the snapshot, which
// must be a valid snapshot of the current Version; on error the state is
// unchanged. The caller (raft) closes rc.
func (f *FSM) Restore(rc io.ReadCloser) error {
	b, err := io.ReadAll(io.LimitReader(rc, MaxSnapshotSize+1))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	if len(b) > MaxSnapshotSize {
		return fmt.Errorf("%w: over %d bytes", ErrSnapshot, MaxSnapshotSize)
	}
	s, err := decodeState(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publish(&current{state: s, applied: f.cur.Load().applied})
	return nil
}

// wireState is the snapshot format.
type wireState struct {
	V               int          `json:"v"`
	Initialized     bool         `json:"initialized"`
	Config          wireConfig   `json:"config"`
	Members         []wireMember `json:"members"`
	Rules           []wireRule   `json:"rules"`
	RulesIndex      uint64       `json:"rules_index"`
	MembershipIndex uint64       `json:"membership_index"`
}

type wireMember struct {
	ID    string      `json:"id"`
	HTTP  string      `json:"http"`
	Raft  string      `json:"raft"`
	Peer  string      `json:"peer"`
	State MemberState `json:"state"`
	Voter bool        `json:"voter"`
	Since uint64      `json:"since"`
}

func encodeState(s *State) ([]byte, error) {
	w := wireState{
		V:               Version,
		Initialized:     s.Initialized,
		Config:          toWireConfig(s.Config),
		Members:         make([]wireMember, len(s.Members)),
		Rules:           toWireRules(s.Rules),
		RulesIndex:      s.RulesIndex,
		MembershipIndex: s.MembershipIndex,
	}
	for i, m := range s.Members {
		w.Members[i] = wireMember(m)
	}
	return json.Marshal(w)
}

// decodeState reads and checks a snapshot: everything Apply could have
// produced passes, anything else is ErrSnapshot.
func decodeState(b []byte) (*State, error) {
	var h struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	if h.V != Version {
		return nil, fmt.Errorf("%w: version %d (want %d)", ErrSnapshot, h.V, Version)
	}
	var w wireState
	if err := decodeStrict(b, &w); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	s := &State{
		Initialized:     w.Initialized,
		Config:          w.Config.config(),
		Rules:           fromWireRules(w.Rules),
		RulesIndex:      w.RulesIndex,
		MembershipIndex: w.MembershipIndex,
	}
	for _, m := range w.Members {
		s.Members = append(s.Members, Member(m))
	}
	if err := checkState(s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	return s, nil
}

// checkState checks the invariants Apply keeps.
func checkState(s *State) error {
	if !s.Initialized {
		if s.Config != (Config{}) || s.Members != nil || s.Rules != nil || s.RulesIndex != 0 || s.MembershipIndex != 0 {
			return errors.New("uninitialized state with content")
		}
		return nil
	}
	if err := checkConfig(s.Config); err != nil {
		return err
	}
	if len(s.Members) > s.Config.Partitions {
		return fmt.Errorf("%d members, more than %d partitions", len(s.Members), s.Config.Partitions)
	}
	if !slices.IsSortedFunc(s.Members, func(a, b Member) int { return strings.Compare(a.ID, b.ID) }) {
		return errors.New("members not sorted by id")
	}
	for i, m := range s.Members {
		if i > 0 && m.ID == s.Members[i-1].ID {
			return fmt.Errorf("duplicate member %q", m.ID)
		}
		if err := checkMember(wireNewMember{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer}); err != nil {
			return err
		}
		if !m.State.Valid() {
			return fmt.Errorf("member %q: state %q", m.ID, m.State)
		}
		if m.Since > s.MembershipIndex {
			return fmt.Errorf("member %q changed at %d, after the last membership change %d", m.ID, m.Since, s.MembershipIndex)
		}
	}
	return rules.Validate(s.Rules)
}
