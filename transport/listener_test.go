package transport

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

// Connections held open without a byte fill the handshake cap, but a
// peer with the secret still gets in: the newest connection takes the
// place of a silent one instead of being refused. Before, 128 silent
// connections (renewed as they timed out) kept every new peer out of the
// data plane and Raft: a router started then answered every check by
// the failure mode, and an election could not reach the voters.
func TestSilentConnectionsCannotLockPeersOut(t *testing.T) {
	// Raft's listener reaches its connection cap first (128 of each).
	for _, maxConns := range []int{64, 4} {
		t.Run(fmt.Sprintf("MaxConns=%d", maxConns), func(t *testing.T) { silentFlood(t, maxConns) })
	}
}

func silentFlood(t *testing.T, maxConns int) {
	auth := &Auth{Secret: testSecret('a'), HandshakeTimeout: time.Minute}
	lcfg := ListenerConfig{MaxConns: maxConns, MaxHandshakes: 4, Auth: auth}
	gl, addr := startGuarded(t, lcfg, DefaultServerConfig())
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	// Six of the ten made room for the last four; nothing timed out.
	eventually(t, func() bool { st := gl.Stats(); return st.OverCap == 6 && st.Open == 4 })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := DefaultClientConfig()
	cfg.Dial = auth.Dial
	cfg.RedialBackoff = 0
	c, err := Dial(ctx, addr, cfg)
	if err != nil {
		t.Fatalf("a peer with the secret, at the handshake cap: %v", err)
	}
	defer c.Close()
	req, resp := batchOf(2, "r"), &BatchResponse{}
	if err := c.Do(ctx, req, resp); err != nil {
		t.Fatalf("a peer with the secret, at the handshake cap: Do: %v", err)
	}
	checkEcho(t, req, resp)
	if st := gl.Stats(); st.Accepted != 1 || st.AuthFailed != 0 || st.OverCap != 7 {
		t.Fatalf("stats %+v: want the peer accepted and one more silent connection closed for it", st)
	}
}

// The handshake closed at the cap is the likeliest not to be a peer's:
// from the busiest host, then silent (nothing for silentAfter) before
// young before heard from (heardBytes), then the oldest. A byte is no
// proof: a flood from another host sending one byte per connection must
// not close a peer's handshake that the listener has not read yet (a
// re-test with real processes: 16 of 17 dials failed when silence ranked
// first), nor may a one-byte flood from the peer's own host outrank a
// peer that sent its first message.
func TestHandshakeVictimOrder(t *testing.T) {
	const now = int64(time.Hour)
	old, young := now-int64(time.Second), now-int64(silentAfter)/2
	const none, oneByte, hello = 0, 1, 43 // a peer's first message is 43 bytes or more
	hs := func(host string, seq uint64, start, got int64) *handshake {
		h := &handshake{host: host, seq: seq, start: start}
		h.got.Store(got)
		return h
	}
	for _, tc := range []struct {
		name    string
		shaking []*handshake
		want    int // index in shaking
	}{
		{"oldest of one host", []*handshake{hs("a", 3, old, none), hs("a", 1, old, none), hs("a", 2, old, none)}, 1},
		{"silent before heard, however old", []*handshake{hs("a", 1, old, hello), hs("a", 2, old, hello), hs("a", 9, old, none)}, 2},
		{"silent before young", []*handshake{hs("a", 1, young, none), hs("a", 2, old, none)}, 1},
		{"young before heard", []*handshake{hs("a", 1, old, hello), hs("a", 9, young, none)}, 1},
		{"a byte is not heard", []*handshake{hs("a", 1, old, oneByte), hs("a", 2, old, oneByte), hs("a", 3, old, hello)}, 0},
		{"a peer's first message outranks a one-byte flood", []*handshake{hs("a", 9, old, hello), hs("a", 1, old, oneByte), hs("a", 2, old, oneByte)}, 1},
		{"busiest host before an older one", []*handshake{hs("peer", 1, old, none), hs("x", 5, old, none), hs("x", 6, old, none)}, 1},
		{"a silent peer kept over a heard flood", []*handshake{hs("x", 1, old, hello), hs("x", 2, old, hello), hs("peer", 3, old, none)}, 0},
		{"a heard peer kept over a silent flood", []*handshake{hs("peer", 1, old, hello), hs("x", 2, old, none), hs("x", 3, old, none)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Listener{shaking: map[*handshake]struct{}{}, perHost: map[string]int{}}
			for _, h := range tc.shaking {
				l.shaking[h] = struct{}{}
				l.perHost[h.host]++
			}
			if got := l.victimLocked(now); got != tc.shaking[tc.want] {
				t.Fatalf("victim host %q seq %d, want host %q seq %d", got.host, got.seq,
					tc.shaking[tc.want].host, tc.shaking[tc.want].seq)
			}
		})
	}
}
