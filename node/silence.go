package node

import (
	"time"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/view"
)

// silentFor is what GET /v1/cluster reports as a member's silence: how
// long before now the leader's failure detector last heard from m (at,
// known), for a member it pings other than self. ok is false where there
// is nothing to report: this node does not lead (a follower's detector
// keeps no record), m is self, down or dead (not pinged), or the
// detector has no record of m yet (its next tick makes one). A record
// from after now (a clock read a moment earlier) reads 0.
func silentFor(leading bool, self string, m fsm.Member, at time.Time, known bool, now time.Time) (time.Duration, bool) {
	if !leading || m.ID == self || !pinged(m) || !known {
		return 0, false
	}
	return max(now.Sub(at), 0), true
}

// addSilence sets, on the leader, each member's SilentMS in c (the
// answer of Cluster): a member that crashed shows as active, with its
// partitions, until it is marked dead after DeadAfter of silence; its
// silence is the hint.
func (n *Node) addSilence(c *view.Cluster, st *fsm.State, now time.Time) {
	leading := n.isLeader()
	if !leading {
		return
	}
	for i := range c.Members {
		m, ok := st.Member(c.Members[i].ID)
		if !ok {
			continue
		}
		at, known := n.contacts.last(m.ID)
		if d, ok := silentFor(leading, n.cfg.ID, m, at, known, now); ok {
			ms := d.Milliseconds()
			c.Members[i].SilentMS = &ms
		}
	}
}
