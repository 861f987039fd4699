package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/transport"
)

func startAuthMember(t *testing.T, id, dir, join string, auth *transport.Auth) *Server {
	t.Helper()
	ls := listen(t)
	s, err := Start(Config{
		ID: id, HTTPAdvertise: ls.HTTP.Addr().String(), RaftAdvertise: ls.Raft.Addr().String(), PeerAdvertise: ls.Peer.Addr().String(),
		DataDir: dir, Join: []string{join}, Ring: ring.Config{Partitions: 128, ReplicationFactor: 64, Load: 1.25},
		RaftTimeout: 300 * time.Millisecond,
		Router:      router.Config{Timeout: 5 * time.Second, RefreshWait: 2 * time.Second},
		Auth:        auth,
	}, ls)
	if err != nil {
		t.Fatal(err)
	}
	shutdownAtCleanup(t, s)
	return s
}

func tlsAuth(t *testing.T, caCert, caKey []byte, name string) *transport.Auth {
	t.Helper()
	certPEM, keyPEM, err := transport.NewNodeCert(caCert, caKey, name, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caCert)
	s, c := transport.TLSConfigs(cert, pool)
	return &transport.Auth{ServerTLS: s, ClientTLS: c, HandshakeTimeout: 2 * time.Second}
}

func newCA(t *testing.T) (cert, key []byte) {
	t.Helper()
	cert, key, err := transport.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// dialStream is a raft.StreamLayer that dials with a given function.
type dialStream struct {
	net.Listener
	dial func(ctx context.Context, addr string) (net.Conn, error)
}

func (d dialStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.dial(ctx, string(addr))
}

// strangerRaft is a Raft transport of somebody outside the cluster.
func strangerRaft(t *testing.T, dial func(ctx context.Context, addr string) (net.Conn, error)) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if dial == nil {
		dial = (&transport.Auth{}).Dial
	}
	tr := raft.NewNetworkTransport(dialStream{Listener: ln, dial: dial}, 1, 2*time.Second, nil)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func raftTerm(s *Server) uint64 {
	n, _ := strconv.ParseUint(s.Node.Raft().Stats()["term"], 10, 64)
	return n
}

// attack runs every door a stranger could try against member s of a
// cluster whose "victim" key allows one check per hour, and asserts
// none of them is acted on.
func attack(t *testing.T, ss []*Server, strangerDial func(ctx context.Context, addr string) (net.Conn, error), strangerAuth *transport.Auth) {
	t.Helper()
	s := ss[0]
	leaderID, _ := s.Node.Raft().LeaderWithID()
	term := raftTerm(s)
	var target raft.ServerAddress
	for _, m := range s.Node.State().Members {
		if m.ID == s.Node.ID() {
			target = raft.ServerAddress(m.Raft)
		}
	}

	t.Run("raft", func(t *testing.T) {
		tr := strangerRaft(t, strangerDial)
		for _, hdrID := range []string{"evil", string(leaderID)} {
			req := &raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(hdrID), Addr: []byte(tr.LocalAddr())},
				Term:      term + 1000,
				Entries:   []*raft.Log{{Index: 1 << 40, Term: term + 1000, Type: raft.LogCommand, Data: []byte("x")}},
			}
			var resp raft.AppendEntriesResponse
			err := tr.AppendEntries(raft.ServerID(s.Node.ID()), target, req, &resp)
			if err == nil && resp.Success {
				t.Fatalf("a stranger's AppendEntries (header id %q) succeeded", hdrID)
			}
		}
		if got := raftTerm(s); got >= term+1000 {
			t.Fatalf("term went from %d to %d: a stranger's RPC was acted on", term, got)
		}
		if err := s.Node.Ready(); err != nil {
			t.Fatalf("member not ready after the attempt: %v", err)
		}
	})

	t.Run("check", func(t *testing.T) {
		v := s.Node.View()
		victim := "victim of " + t.Name()
		kh := limiter.KeyHash(v.Seed, victim) // the stranger knows the seed
		req := &transport.BatchRequest{Epoch: v.Ring.Epoch(), Checks: []transport.Check{{Rule: "once", KeyHash: kh, Partition: v.Ring.Partition(kh), Cost: 1}}}
		cfg := transport.DefaultClientConfig()
		cfg.Dial = strangerDial
		cfg.RedialBackoff = 0
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, m := range s.Node.State().Members {
			c, err := transport.Dial(ctx, m.Peer, cfg)
			if err != nil {
				continue // refused during the handshake
			}
			var resp transport.BatchResponse
			err = c.Do(ctx, req, &resp)
			c.Close()
			if err == nil {
				t.Fatalf("a stranger's check on %s was answered: %+v", m.ID, resp.Results)
			}
		}
		if r := check(t, s, "once", victim); !r.Allowed || r.Degraded {
			t.Fatalf("the victim's first check = %+v: the stranger spent its budget", r)
		}
	})

	t.Run("join", func(t *testing.T) {
		// The stranger runs a member of its own (its listeners speak its
		// authentication) and asks the leader to add it.
		st := startAuthMember(t, "stranger", t.TempDir(), "", strangerAuth)
		eventually(t, "the stranger's own cluster", func() bool { return st.Node.Ready() == nil })
		req := api.JoinRequest{ID: "stranger", HTTP: st.cfg.HTTPAdvertise, Raft: st.cfg.RaftAdvertise, Peer: st.cfg.PeerAdvertise}
		var err error
		// Asked of any member (forwarded to the leader); retried only
		// while the cluster has no leader (an election under load).
		eventually(t, "an answer to the join", func() bool {
			_, err = s.Node.Join(context.Background(), req)
			return !errors.Is(err, api.ErrUnavailable)
		})
		if !errors.Is(err, api.ErrBadRequest) {
			t.Fatalf("join of a stranger = %v, want a refusal (bad request)", err)
		}
		for _, srv := range s.Node.Raft().GetConfiguration().Configuration().Servers {
			if srv.ID == "stranger" {
				t.Fatal("the stranger is in the raft configuration")
			}
		}
	})
}

func setupVictim(t *testing.T, ss []*Server) {
	putRules(t, ss, limiter.Rule{Name: "once", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
}

func TestStrangerWithoutTheSecret(t *testing.T) {
	secret := bytes.Repeat([]byte("s"), 32)
	auth := &transport.Auth{Secret: secret, HandshakeTimeout: 2 * time.Second}
	s1 := startAuthMember(t, "n1", t.TempDir(), "", auth)
	eventually(t, "n1 ready", func() bool { return s1.Node.Ready() == nil })
	s2 := startAuthMember(t, "n2", t.TempDir(), s1.cfg.HTTPAdvertise, auth)
	ss := []*Server{s1, s2}
	waitSettled(t, ss, 2)
	setupVictim(t, ss)
	wrong := &transport.Auth{Secret: bytes.Repeat([]byte("w"), 32), HandshakeTimeout: 2 * time.Second}
	t.Run("no secret", func(t *testing.T) { attack(t, ss, nil, nil) })
	t.Run("wrong secret", func(t *testing.T) { attack(t, ss, wrong.Dial, wrong) })
}

func TestStrangerWithAnotherCA(t *testing.T) {
	caCert, caKey := newCA(t)
	otherCert, otherKey := newCA(t)
	s1 := startAuthMember(t, "n1", t.TempDir(), "", tlsAuth(t, caCert, caKey, "n1"))
	eventually(t, "n1 ready", func() bool { return s1.Node.Ready() == nil })
	s2 := startAuthMember(t, "n2", t.TempDir(), s1.cfg.HTTPAdvertise, tlsAuth(t, caCert, caKey, "n2"))
	ss := []*Server{s1, s2}
	waitSettled(t, ss, 2)
	setupVictim(t, ss)
	other := tlsAuth(t, otherCert, otherKey, "n1") // even under a member's name
	attack(t, ss, other.Dial, other)
}

// With the secret but outside the configuration (a removed member, a
// node of another cluster sharing the secret), Raft RPCs are refused by
// the guard; and a term that would wrap is refused even from a listed id.
func TestRaftGuardRefusesUnlistedSenders(t *testing.T) {
	auth := &transport.Auth{Secret: bytes.Repeat([]byte("s"), 32), HandshakeTimeout: 2 * time.Second}
	s := startAuthMember(t, "n1", t.TempDir(), "", auth)
	eventually(t, "n1 ready", func() bool { return s.Node.Ready() == nil })
	term := raftTerm(s)
	tr := strangerRaft(t, auth.Dial)
	self := raft.ServerAddress(s.cfg.RaftAdvertise)
	for _, tc := range []struct {
		id, addr string
		term     uint64
	}{
		{"evil", string(tr.LocalAddr()), term + 5},
		{"n1", string(tr.LocalAddr()), term + 5}, // a listed id at an unlisted address
		{"n1", string(self), 1<<64 - 1},          // a term that wraps
		{"", "", term + 5},                       // no header
	} {
		req := &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(tc.id), Addr: []byte(tc.addr)},
			Term: tc.term, LastLogIndex: 1 << 40, LastLogTerm: tc.term}
		var resp raft.RequestVoteResponse
		if err := tr.RequestVote("n1", self, req, &resp); err == nil {
			t.Errorf("RequestVote from %q at %q term %d was answered (granted %v), want refused", tc.id, tc.addr, tc.term, resp.Granted)
		}
	}
	if got := raftTerm(s); got != term || s.Node.Ready() != nil {
		t.Fatalf("term %d → %d, ready: %v", term, got, s.Node.Ready())
	}
}

// A join naming addresses nobody answers on, or malformed ones, is
// refused and the cluster keeps its quorum; a live member's id at other
// addresses is a conflict.
func TestJoinValidated(t *testing.T) {
	s := startMember(t, "n1", t.TempDir(), "")
	eventually(t, "n1 ready", func() bool { return s.Node.Ready() == nil })
	dead := func() string { // a port nobody listens on any more
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	for _, tc := range []struct {
		req  api.JoinRequest
		want error
	}{
		{api.JoinRequest{ID: "ghost", HTTP: dead(), Raft: dead(), Peer: dead()}, api.ErrBadRequest},
		{api.JoinRequest{ID: "ghost", HTTP: "%%%", Raft: dead(), Peer: dead()}, api.ErrBadRequest},
		{api.JoinRequest{ID: "ghost", HTTP: dead(), Raft: "%%%", Peer: dead()}, api.ErrBadRequest},
		{api.JoinRequest{ID: "ghost", HTTP: dead(), Raft: dead(), Peer: "h:99999"}, api.ErrBadRequest},
		{api.JoinRequest{ID: "gh ost", HTTP: dead(), Raft: dead(), Peer: dead()}, api.ErrBadRequest},
		{api.JoinRequest{ID: "n1", HTTP: dead(), Raft: s.cfg.RaftAdvertise + "0", Peer: dead()}, api.ErrBadRequest},
	} {
		if _, err := s.Node.Join(context.Background(), tc.req); !errors.Is(err, tc.want) {
			t.Errorf("Join(%+v) = %v, want %v", tc.req, err, tc.want)
		}
	}
	// The leader's own id from another process, at addresses that answer:
	// a conflict, and the leader's voter keeps its address. Was: taken as
	// the leader's own registration, which re-addressed its voter to the
	// stranger, so the cluster lost its leader for good.
	stranger := listen(t)
	defer func() { stranger.HTTP.Close(); stranger.Raft.Close(); stranger.Peer.Close() }()
	if _, err := s.Node.Join(context.Background(), api.JoinRequest{ID: "n1", HTTP: stranger.HTTP.Addr().String(),
		Raft: stranger.Raft.Addr().String(), Peer: stranger.Peer.Addr().String()}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a join with the leader's id at other addresses = %v, want conflict", err)
	}
	if srv := s.Node.Raft().GetConfiguration().Configuration().Servers; len(srv) != 1 || string(srv[0].Address) != s.cfg.RaftAdvertise {
		t.Fatalf("raft servers %+v, want n1 alone at %s", srv, s.cfg.RaftAdvertise)
	}
	if m, _ := s.Node.View().Ring.Owner(0); m.Peer != s.cfg.PeerAdvertise {
		t.Fatalf("partition 0's owner at peer %s, want n1's own %s", m.Peer, s.cfg.PeerAdvertise)
	}
	if err := s.Node.Ready(); err != nil {
		t.Fatalf("not ready after refused joins: %v", err)
	}
	putRules(t, []*Server{s}, limiter.Rule{Name: "after", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Second})

	// n2 is live; a second process claiming n2 from elsewhere is refused.
	s2 := startMember(t, "n2", t.TempDir(), s.cfg.HTTPAdvertise)
	waitSettled(t, []*Server{s, s2}, 2)
	other := listen(t)
	defer func() { other.HTTP.Close(); other.Raft.Close(); other.Peer.Close() }()
	var err error
	eventually(t, "an answer to the join", func() bool { // retried only while there is no leader
		_, err = s.Node.Join(context.Background(), api.JoinRequest{ID: "n2", HTTP: other.HTTP.Addr().String(), Raft: other.Raft.Addr().String(), Peer: other.Peer.Addr().String()})
		return !errors.Is(err, api.ErrUnavailable)
	})
	if !errors.Is(err, api.ErrConflict) {
		t.Fatalf("duplicate live id: %v, want conflict", err)
	}
}

// The forwarder (writes and joins to the leader, with the admin token)
// never goes through HTTP_PROXY: the token would travel to the proxy.
// http.ProxyFromEnvironment reads the environment once per process, so
// the transport's setting is what is checked.
func TestForwarderUsesNoProxy(t *testing.T) {
	tr, ok := newForwarder("t").hc.Transport.(*http.Transport)
	if !ok || tr.Proxy != nil {
		t.Fatalf("forwarder transport %T with a proxy function; want none", newForwarder("t").hc.Transport)
	}
}
