// Package fsm is ringlimit's replicated state machine: the hashicorp/raft
// FSM that holds the cluster's config, its members and its written rules.
//
// Model: the state is an immutable *State value. Every command that changes
// it builds a new State and publishes it atomically; readers call
// FSM.State and never lock, and must not modify what they get. Apply is a
// pure function of (state, log index, command bytes): it reads no clock,
// no randomness and no environment, so every node that applies the same
// log reaches the same State. A bad command is an error value returned as
// the raft response, never a panic, and leaves the state unchanged.
//
// Commands are JSON objects {"v": 1, "op": "...", ...}, built by the
// encoders Init, PutRules, AddMember, RemoveMember and SetMemberState.
// Snapshots are the whole State as versioned JSON.
//
// Concurrency: raft calls Apply, Snapshot and Restore from one goroutine;
// FSM serialises them anyway. State, Watch and the cancel funcs are safe
// for concurrent use from any goroutine.
package fsm

import (
	"slices"
	"strings"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rules"
)

// Config is the cluster's fixed configuration, set once by Init: the ring's
// placement parameters and the secret seed of the key hashes.
type Config struct {
	Partitions        int     // ring.Config.Partitions
	ReplicationFactor int     // ring.Config.ReplicationFactor
	Load              float64 // ring.Config.Load
	// Seed keys every bucket hash (limiter.KeyHash). It is a secret: it
	// is tagged json:"-" so that marshalling a Config cannot leak it.
	Seed uint64 `json:"-"`
}

// Ring returns the ring's part of the config.
func (c Config) Ring() ring.Config {
	return ring.Config{Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor, Load: c.Load}
}

// MemberState is a member's place in the cluster's life cycle.
type MemberState string

// The member states. Only active members own partitions.
const (
	Active   MemberState = "active"   // owns partitions
	Draining MemberState = "draining" // handing its partitions off
	Down     MemberState = "down"     // stopped gracefully, still a member
	Dead     MemberState = "dead"     // marked by failure detection
)

// Valid reports whether s is one of the four member states.
func (s MemberState) Valid() bool {
	return s == Active || s == Draining || s == Down || s == Dead
}

// Member is a cluster member as the log records it.
type Member struct {
	ID    string      // unique node id; also its raft server id
	HTTP  string      // host:port of its HTTP API
	Raft  string      // host:port of its raft transport
	Peer  string      // host:port of its data plane
	State MemberState // active, draining, down or dead
	Voter bool        // whether it votes in raft
	Since uint64      // raft index of its last change (added, moved, state)
}

// State is the replicated state. A *State obtained from FSM.State is
// immutable: never modify it or the slices it holds.
type State struct {
	// Initialized is set by the one Init command; Config is zero before.
	Initialized bool
	Config      Config
	// Members, sorted by ID.
	Members []Member
	// Rules are the written rules (rules.Effective gives the set in
	// force), in the order written.
	Rules []limiter.Rule
	// RulesIndex is the raft index of the last rules write.
	RulesIndex uint64
	// MembershipIndex is the raft index of the last change to the ring's
	// input (Init or a membership change): the ring epoch.
	MembershipIndex uint64
}

// Member returns the member with the given id.
func (s *State) Member(id string) (Member, bool) {
	i, ok := s.find(id)
	if !ok {
		return Member{}, false
	}
	return s.Members[i], true
}

func (s *State) find(id string) (int, bool) {
	return slices.BinarySearchFunc(s.Members, id, func(m Member, id string) int { return strings.Compare(m.ID, id) })
}

// Active returns the members in state active, sorted by ID, in a new slice.
func (s *State) Active() []Member {
	var out []Member
	for _, m := range s.Members {
		if m.State == Active {
			out = append(out, m)
		}
	}
	return out
}

// EffectiveRules returns the rule set in force, rules.Effective(s.Rules),
// in a new slice.
func (s *State) EffectiveRules() []limiter.Rule { return rules.Effective(s.Rules) }

// clone returns a copy of s whose slices may be modified.
func (s *State) clone() *State {
	c := *s
	c.Members = slices.Clone(s.Members)
	c.Rules = slices.Clone(s.Rules)
	return &c
}
