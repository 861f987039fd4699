package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

// Version is the command and snapshot format this package writes and the
// only one it reads.
const Version = 1

// The command ops.
const (
	OpInit           = "init"
	OpPutRules       = "put_rules"
	OpAddMember      = "add_member"
	OpRemoveMember   = "remove_member"
	OpSetMemberState = "set_member_state"
)

// Limits on command arguments.
const (
	// MaxIDLen bounds a member's ID and each of its addresses.
	MaxIDLen = 256
)

// Errors returned by Apply (as the raft response), by the encoders and by
// Restore. A rejected PutRules returns the *rules.Error of rules.Validate
// instead, which wraps rules.ErrInvalid.
var (
	// ErrMalformed: the command is not a JSON object of its op's fields.
	ErrMalformed = errors.New("fsm: malformed command")
	// ErrVersion: the command's "v" is not Version.
	ErrVersion = errors.New("fsm: unsupported command version")
	// ErrUnknownOp: the command's "op" is none of the Op constants.
	ErrUnknownOp = errors.New("fsm: unknown command")
	// ErrInvalid: an argument is out of range (config, member, state).
	ErrInvalid = errors.New("fsm: invalid command")
	// ErrInitialized: Init on a cluster that already has a config.
	ErrInitialized = errors.New("fsm: cluster already initialized")
	// ErrNotInitialized: a command other than Init before Init.
	ErrNotInitialized = errors.New("fsm: cluster not initialized")
	// ErrUnknownMember: RemoveMember or SetMemberState of an id that is
	// not a member.
	ErrUnknownMember = errors.New("fsm: unknown member")
	// ErrSnapshot: Restore read a corrupt, invalid or unknown-version
	// snapshot.
	ErrSnapshot = errors.New("fsm: invalid snapshot")
)

// The wire forms. They are the log's format: change them only with a new
// Version.

type header struct {
	V  int    `json:"v"`
	Op string `json:"op"`
}

type wireConfig struct {
	Partitions        int     `json:"partitions"`
	ReplicationFactor int     `json:"replication_factor"`
	Load              float64 `json:"load"`
	Seed              uint64  `json:"seed"`
}

type wireRule struct {
	Name        string              `json:"name"`
	Algorithm   limiter.Algorithm   `json:"algorithm"`
	Limit       int64               `json:"limit"`
	Period      int64               `json:"period_ns"`
	Burst       int64               `json:"burst"`
	FailureMode limiter.FailureMode `json:"failure_mode"`
}

type wireNewMember struct {
	ID    string `json:"id"`
	HTTP  string `json:"http"`
	Raft  string `json:"raft"`
	Peer  string `json:"peer"`
	Voter bool   `json:"voter"`
}

type initCmd struct {
	header
	Config wireConfig `json:"config"`
}

type putRulesCmd struct {
	header
	Rules []wireRule `json:"rules"`
}

type addMemberCmd struct {
	header
	Member wireNewMember `json:"member"`
}

type removeMemberCmd struct {
	header
	ID string `json:"id"`
}

type setMemberStateCmd struct {
	header
	ID    string      `json:"id"`
	State MemberState `json:"state"`
}

func toWireConfig(c Config) wireConfig {
	return wireConfig(c)
}

func (w wireConfig) config() Config {
	return Config(w)
}

func toWireRules(rs []limiter.Rule) []wireRule {
	out := make([]wireRule, len(rs))
	for i, r := range rs {
		out[i] = wireRule{Name: r.Name, Algorithm: r.Algorithm, Limit: r.Limit, Period: int64(r.Period), Burst: r.Burst, FailureMode: r.FailureMode}
	}
	return out
}

func fromWireRules(ws []wireRule) []limiter.Rule {
	if len(ws) == 0 {
		return nil
	}
	out := make([]limiter.Rule, len(ws))
	for i, w := range ws {
		out[i] = limiter.Rule{Name: w.Name, Algorithm: w.Algorithm, Limit: w.Limit, Period: time.Duration(w.Period), Burst: w.Burst, FailureMode: w.FailureMode}
	}
	return out
}

// Init returns the command that sets the cluster's config, once: applied to
// an initialized state it fails with ErrInitialized. The config must pass
// ring.Config.Validate and have a nonzero Seed.
func Init(cfg Config) ([]byte, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	return encode(initCmd{header{Version, OpInit}, toWireConfig(cfg)}), nil
}

// PutRules returns the command that replaces the written rules with rs (nil
// or empty: no written rules, only the built-in default). rs must pass
// rules.Validate; Apply checks again.
func PutRules(rs []limiter.Rule) ([]byte, error) {
	if err := rules.Validate(rs); err != nil {
		return nil, err
	}
	return encode(putRulesCmd{header{Version, OpPutRules}, toWireRules(rs)}), nil
}

// WrittenRules returns the rules a PutRules command data writes, and
// false for any other command or data that is not a valid command of
// this Version. It applies nothing: a node reads its log with it.
func WrittenRules(data []byte) ([]limiter.Rule, bool) {
	var h header
	if json.Unmarshal(data, &h) != nil || h.V != Version || h.Op != OpPutRules {
		return nil, false
	}
	var c putRulesCmd
	if decodeStrict(data, &c) != nil {
		return nil, false
	}
	return fromWireRules(c.Rules), true
}

// AddMember returns the command that adds m as an active member, or updates
// the member with m's ID to m's addresses and Voter and makes it active.
// Adding a member that is already active with the same addresses and Voter
// changes nothing. m.State and m.Since are ignored; a change of Voter
// alone keeps the member's Since (it does not move in the ring).
func AddMember(m Member) ([]byte, error) {
	w := wireNewMember{ID: m.ID, HTTP: m.HTTP, Raft: m.Raft, Peer: m.Peer, Voter: m.Voter}
	if err := checkMember(w); err != nil {
		return nil, err
	}
	return encode(addMemberCmd{header{Version, OpAddMember}, w}), nil
}

// RemoveMember returns the command that removes the member id; applied
// when id is not a member it fails with ErrUnknownMember.
func RemoveMember(id string) ([]byte, error) {
	if err := checkID("id", id); err != nil {
		return nil, err
	}
	return encode(removeMemberCmd{header{Version, OpRemoveMember}, id}), nil
}

// SetMemberState returns the command that moves member id to state s;
// applied when id is not a member it fails with ErrUnknownMember. Setting
// the state a member already has changes nothing.
func SetMemberState(id string, s MemberState) ([]byte, error) {
	if err := checkID("id", id); err != nil {
		return nil, err
	}
	if !s.Valid() {
		return nil, fmt.Errorf("%w: state %q: want active, draining, down or dead", ErrInvalid, s)
	}
	return encode(setMemberStateCmd{header{Version, OpSetMemberState}, id, s}), nil
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a rule with an invalid algorithm or failure mode fails to
		// marshal, and PutRules validates first.
		panic("fsm: encode: " + err.Error())
	}
	return b
}

// decodeStrict decodes one JSON value of exactly v's fields from data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the command")
	}
	return nil
}

// apply returns the state after the command data at log index. It returns
// s itself when the command changes nothing, and (nil, error) when the
// command is rejected. It never modifies s.
func apply(s *State, index uint64, data []byte) (*State, error) {
	var h header
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if h.V != Version {
		return nil, fmt.Errorf("%w %d (want %d)", ErrVersion, h.V, Version)
	}
	var err error
	switch h.Op {
	case OpInit:
		var c initCmd
		if err = decodeStrict(data, &c); err == nil {
			return applyInit(s, index, c)
		}
	case OpPutRules:
		var c putRulesCmd
		if err = decodeStrict(data, &c); err == nil {
			return applyPutRules(s, index, c)
		}
	case OpAddMember:
		var c addMemberCmd
		if err = decodeStrict(data, &c); err == nil {
			return applyAddMember(s, index, c)
		}
	case OpRemoveMember:
		var c removeMemberCmd
		if err = decodeStrict(data, &c); err == nil {
			return applyRemoveMember(s, index, c)
		}
	case OpSetMemberState:
		var c setMemberStateCmd
		if err = decodeStrict(data, &c); err == nil {
			return applySetMemberState(s, index, c)
		}
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownOp, h.Op)
	}
	return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, h.Op, err)
}

func applyInit(s *State, index uint64, c initCmd) (*State, error) {
	if s.Initialized {
		return nil, ErrInitialized
	}
	cfg := c.Config.config()
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	n := s.clone()
	n.Initialized, n.Config, n.MembershipIndex = true, cfg, index
	return n, nil
}

func applyPutRules(s *State, index uint64, c putRulesCmd) (*State, error) {
	if !s.Initialized {
		return nil, fmt.Errorf("%w: %s", ErrNotInitialized, OpPutRules)
	}
	rs := fromWireRules(c.Rules)
	if err := rules.Validate(rs); err != nil {
		return nil, err
	}
	n := s.clone()
	n.Rules, n.RulesIndex = rs, index
	return n, nil
}

func applyAddMember(s *State, index uint64, c addMemberCmd) (*State, error) {
	if !s.Initialized {
		return nil, fmt.Errorf("%w: %s", ErrNotInitialized, OpAddMember)
	}
	w := c.Member
	if err := checkMember(w); err != nil {
		return nil, err
	}
	m := Member{ID: w.ID, HTTP: w.HTTP, Raft: w.Raft, Peer: w.Peer, State: Active, Voter: w.Voter, Since: index}
	i, found := s.find(m.ID)
	if found {
		prev := s.Members[i]
		if prev.State == Active && prev.HTTP == m.HTTP && prev.Raft == m.Raft && prev.Peer == m.Peer {
			// Only its vote changes (a non-voter promoted): not a change
			// of the member in the ring, so Since stays.
			m.Since = prev.Since
		}
		if prev == m {
			return s, nil
		}
	} else if len(s.Members) >= s.Config.Partitions {
		return nil, fmt.Errorf("%w: %s: %d members already, as many as partitions", ErrInvalid, OpAddMember, len(s.Members))
	}
	n := s.clone()
	if found {
		n.Members[i] = m
	} else {
		n.Members = slices.Insert(n.Members, i, m)
	}
	n.MembershipIndex = index
	return n, nil
}

func applyRemoveMember(s *State, index uint64, c removeMemberCmd) (*State, error) {
	if !s.Initialized {
		return nil, fmt.Errorf("%w: %s", ErrNotInitialized, OpRemoveMember)
	}
	i, found := s.find(c.ID)
	if !found {
		return nil, fmt.Errorf("%w %q", ErrUnknownMember, c.ID)
	}
	n := s.clone()
	n.Members = slices.Delete(n.Members, i, i+1)
	if len(n.Members) == 0 {
		n.Members = nil
	}
	n.MembershipIndex = index
	return n, nil
}

func applySetMemberState(s *State, index uint64, c setMemberStateCmd) (*State, error) {
	if !s.Initialized {
		return nil, fmt.Errorf("%w: %s", ErrNotInitialized, OpSetMemberState)
	}
	if !c.State.Valid() {
		return nil, fmt.Errorf("%w: %s: state %q: want active, draining, down or dead", ErrInvalid, OpSetMemberState, c.State)
	}
	i, found := s.find(c.ID)
	if !found {
		return nil, fmt.Errorf("%w %q", ErrUnknownMember, c.ID)
	}
	if s.Members[i].State == c.State {
		return s, nil
	}
	n := s.clone()
	n.Members[i].State, n.Members[i].Since = c.State, index
	n.MembershipIndex = index
	return n, nil
}

// checkConfig checks an Init config.
func checkConfig(c Config) error {
	if err := c.Ring().Validate(); err != nil {
		return fmt.Errorf("%w: config: %w", ErrInvalid, err)
	}
	if c.Seed == 0 {
		return fmt.Errorf("%w: config: Seed is 0; want a random secret", ErrInvalid)
	}
	return nil
}

// checkMember checks an AddMember argument.
func checkMember(w wireNewMember) error {
	for _, f := range []struct{ name, v string }{{"id", w.ID}, {"http", w.HTTP}, {"raft", w.Raft}, {"peer", w.Peer}} {
		if err := checkID(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// checkID checks a member id or address: 1 to MaxIDLen printable ASCII
// characters, no spaces.
func checkID(field, s string) error {
	ok := len(s) > 0 && len(s) <= MaxIDLen
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > ' ' && s[i] < 0x7f
	}
	if !ok {
		return fmt.Errorf("%w: member %s %q: want 1 to %d printable characters without spaces", ErrInvalid, field, truncate(s), MaxIDLen)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
