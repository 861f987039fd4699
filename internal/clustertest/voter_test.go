package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
)

// The cluster state's Voter flag of a member follows Raft's configuration
// when the write that should have set it was lost (promote makes the
// member a Raft voter, then writes the flag; a lost lead, a timeout or a
// shutdown in between used to leave the flag false for good, because
// promote and promoteNonvoters look only at Raft). Each case leaves the
// state a lost write leaves; the leader then in charge corrects it.
func TestVoterFlagFollowsRaft(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stale makes the flag of the members it returns stale (and
		// whatever else the case is about); the states to check are
		// those at or after the log index it returns.
		stale func(t *testing.T, c *Cluster, p *gatedProber) ([]string, uint64)
	}{
		{"rewritten while the leader leads", func(t *testing.T, c *Cluster, _ *gatedProber) ([]string, uint64) {
			l := c.Leader()
			id := otherThan(c, l.ID)
			return []string{id}, writeVoterFlag(t, l, id, false)
		}},
		{"rewritten, then the leader crashes", func(t *testing.T, c *Cluster, _ *gatedProber) ([]string, uint64) {
			l := c.Leader()
			var ids []string
			var at uint64
			for _, m := range c.Members() {
				if m != l {
					at = writeVoterFlag(t, l, m.ID, false)
					ids = append(ids, m.ID)
				}
			}
			c.Crash(l.ID)
			c.WaitFor("a new leader", 10*time.Second, func() bool { n := c.Leader(); return n != nil && n != l })
			c.Restart(l.ID)
			return ids, at
		}},
		{"a promotion that got as far as Raft", func(t *testing.T, c *Cluster, p *gatedProber) ([]string, uint64) {
			p.held.Store((&Member{ID: "n4"}).httpAddr(), true)
			n4 := c.Join("n4") // a non-voter whose promotion waits for it to catch up
			// promote's first half, as the leader does it: n4 votes in
			// Raft, and the write of its flag is lost.
			l := c.Leader()
			if err := l.Node().Raft().AddVoter("n4", raft.ServerAddress(n4.raftAddr()), 0, 5*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			p.held.Clear() // caught up: its promotion finds it a voter already
			return []string{"n4"}, 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := &gatedProber{}
				c := New(t, 3, Options{Prober: p})
				c.WaitFor("n2 and n3 promoted, flags agreeing", 10*time.Second, func() bool {
					return raftVoter(c, "n2") && raftVoter(c, "n3") && flagsAgree(c)()
				})
				ids, at := tc.stale(t, c, p)
				for _, id := range ids {
					if !raftVoter(c, id) {
						t.Fatalf("%s does not vote in Raft: nothing to correct", id)
					}
				}
				c.WaitFor("every member's flag as Raft says", 10*time.Second, func() bool {
					for _, m := range c.Members() {
						if st := m.Node().State(); m.Running() && (st == nil || st.MembershipIndex < at) {
							return false // the stale write is not in its view yet
						}
					}
					return flagsAgree(c)()
				})
			})
		})
	}
}

// writeVoterFlag writes member id's Voter flag through l's Raft, as the
// state would be after l made it a voter and lost the write of its flag,
// and returns the write's log index.
func writeVoterFlag(t *testing.T, l *Member, id string, voter bool) uint64 {
	t.Helper()
	m, ok := l.Node().State().Member(id)
	if !ok {
		t.Fatalf("no member %s", id)
	}
	m.Voter = voter
	cmd, err := fsm.AddMember(m)
	if err != nil {
		t.Fatal(err)
	}
	f := l.Node().Raft().Apply(cmd, 5*time.Second)
	if err := fsm.Result(f); err != nil {
		t.Fatal(err)
	}
	return f.Index()
}

// otherThan is a member other than id.
func otherThan(c *Cluster, id string) string {
	for _, m := range c.Members() {
		if m.ID != id {
			return m.ID
		}
	}
	return ""
}

// raftVoter reports whether id votes in the leader's Raft configuration.
func raftVoter(c *Cluster, id string) bool {
	s, ok := raftServer(c, id)
	return ok && s.Suffrage == raft.Voter
}

// raftVoterCount counts the voters of the leader's Raft configuration.
func raftVoterCount(c *Cluster) int {
	n := 0
	for _, m := range c.Members() {
		if raftVoter(c, m.ID) {
			n++
		}
	}
	return n
}

// raftServer returns id's entry in the leader's Raft configuration.
func raftServer(c *Cluster, id string) (raft.Server, bool) {
	l := c.Leader()
	if l == nil {
		return raft.Server{}, false
	}
	cf := l.Node().Raft().GetConfiguration()
	if cf.Error() != nil {
		return raft.Server{}, false
	}
	return findServer(cf.Configuration().Servers, id)
}

// findServer returns id's entry among servers.
func findServer(servers []raft.Server, id string) (raft.Server, bool) {
	for _, s := range servers {
		if string(s.ID) == id {
			return s, true
		}
	}
	return raft.Server{}, false
}

// flagsAgree reports whether every running member's state has every
// member's Voter flag as the leader's Raft configuration has it.
func flagsAgree(c *Cluster) func() bool {
	return func() bool {
		for _, on := range c.Members() {
			if !on.Running() {
				continue
			}
			st := on.Node().State()
			if st == nil {
				return false
			}
			for _, m := range st.Members {
				if m.Voter != raftVoter(c, m.ID) {
					return false
				}
			}
		}
		return true
	}
}

// When a voter leaves a cluster with a non-voter, the non-voter takes its
// seat: a cluster of six keeps five voters after one leaves, whether the
// voter left gracefully or crashed, was marked dead and was then removed
// (a new user's six-member cluster kept four voters after `leave` of a
// dead voter: the leader promoted only when a member joined or when it
// gained the lead).
func TestNonVoterTakesTheSeatOfAVoterThatLeft(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "graceful leave", true: "crashed, marked dead, left"}[crash], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := New(t, 6, Options{DeadAfter: 2 * time.Second, Prober: &gatedProber{}}) // a prober, as serve has: joins promote later
				// Joins promote later: until five seats are taken, a second
				// non-voter may still be on its way to one, and would count
				// as the seat this test waits for (a flake under -race).
				c.WaitFor("five voters before anyone leaves", 10*time.Second, func() bool { return raftVoterCount(c) == 5 })
				nonVoter, voter := "", ""
				for _, m := range c.Members() {
					switch {
					case !raftVoter(c, m.ID):
						nonVoter = m.ID
					case m.ID != c.Leader().ID && voter == "":
						voter = m.ID
					}
				}
				if nonVoter == "" || voter == "" {
					t.Fatalf("want a non-voter and a voter that does not lead; got %q and %q", nonVoter, voter)
				}
				if crash {
					c.Crash(voter)
					c.WaitFor(voter+" marked dead", 10*time.Second, func() bool {
						m, _ := c.Leader().Node().State().Member(voter)
						return m.State == fsm.Dead
					})
					if err := c.Leader().Node().Leave(context.Background(), voter); err != nil {
						t.Fatalf("leave %s: %v", voter, err)
					}
				} else {
					c.Leave(voter)
				}
				c.WaitFor(nonVoter+" promoted in "+voter+"'s place", 10*time.Second, func() bool { return raftVoter(c, nonVoter) })
				voters := 0
				for _, m := range c.Members() {
					if m.ID != voter && raftVoter(c, m.ID) {
						voters++
					}
				}
				if voters != 5 {
					t.Fatalf("%d voters after %s left, want 5", voters, voter)
				}
			})
		})
	}
}
