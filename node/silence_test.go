package node

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/fsm"
)

func TestSilentFor(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(ms int) time.Time { return now.Add(-time.Duration(ms) * time.Millisecond) }
	m := func(id string, s fsm.MemberState) fsm.Member { return fsm.Member{ID: id, State: s} }
	for _, tc := range []struct {
		name    string
		leading bool
		m       fsm.Member
		at      time.Time
		known   bool
		want    time.Duration
		ok      bool
	}{
		{"active, heard 3.2s ago", true, m("b", fsm.Active), ago(3200), true, 3200 * time.Millisecond, true},
		{"draining is pinged too", true, m("b", fsm.Draining), ago(10), true, 10 * time.Millisecond, true},
		{"just heard", true, m("b", fsm.Active), now, true, 0, true},
		{"record after now reads 0", true, m("b", fsm.Active), now.Add(time.Millisecond), true, 0, true},
		{"a follower reports nothing", false, m("b", fsm.Active), ago(3200), true, 0, false},
		{"not for the leader itself", true, m("a", fsm.Active), ago(3200), true, 0, false},
		{"not for a down member", true, m("b", fsm.Down), ago(3200), true, 0, false},
		{"not for a dead member", true, m("b", fsm.Dead), ago(3200), true, 0, false},
		{"no record yet", true, m("b", fsm.Active), time.Time{}, false, 0, false},
	} {
		got, ok := silentFor(tc.leading, "a", tc.m, tc.at, tc.known, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: silentFor = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// Reading a contact does not record one: a member the detector has not
// counted yet keeps no record (seen, the detector's, would start one).
func TestContactsLastRecordsNothing(t *testing.T) {
	var c contacts
	if _, ok := c.last("b"); ok {
		t.Fatal("last(b) on no records: found one")
	}
	if _, ok := c.last("b"); ok {
		t.Fatal("last(b) recorded b")
	}
	at := time.Unix(5, 0)
	c.set("b", at)
	if got, ok := c.last("b"); !ok || !got.Equal(at) {
		t.Fatalf("last(b) = %v, %v; want %v, true", got, ok, at)
	}
}
