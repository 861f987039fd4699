package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/pipenet"
)

func testSecret(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// handshakePair runs dialer and acceptor on the two ends of a pipe.
func handshakePair(t *testing.T, dial, acc *Auth) (dErr, aErr error) {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, aErr = acc.Server(context.Background(), c2, []string{"n1:8082"})
		if aErr != nil {
			c2.Close()
		}
	}()
	_, dErr = dial.Client(context.Background(), c1, "n1:8082")
	if dErr != nil {
		c1.Close()
	}
	wg.Wait()
	return dErr, aErr
}

func TestSecretHandshake(t *testing.T) {
	good := &Auth{Secret: testSecret('a'), HandshakeTimeout: time.Second}
	bad := &Auth{Secret: testSecret('b'), HandshakeTimeout: time.Second}
	for _, tt := range []struct {
		name       string
		dial, acc  *Auth
		dOK, accOK bool
	}{
		{"same secret", good, good, true, true},
		{"dialer has another secret", bad, good, false, false},
		{"acceptor has another secret", good, bad, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dErr, aErr := handshakePair(t, tt.dial, tt.acc)
			if (dErr == nil) != tt.dOK || (aErr == nil) != tt.accOK {
				t.Fatalf("dialer err %v, acceptor err %v; want ok %v/%v", dErr, aErr, tt.dOK, tt.accOK)
			}
			if !tt.accOK && !errors.Is(aErr, ErrAuth) && !errors.Is(dErr, ErrAuth) {
				t.Fatalf("no ErrAuth in %v / %v", dErr, aErr)
			}
		})
	}
}

// A dialer that sends a frame instead of a handshake, or nothing, is
// refused and its bytes are never taken for frames.
func TestHandshakeRefusesStrangers(t *testing.T) {
	acc := &Auth{Secret: testSecret('a'), HandshakeTimeout: 200 * time.Millisecond}
	for _, tt := range []struct {
		name string
		send []byte
	}{
		{"a frame", AppendBatchRequest(nil, 1, 0, batchOf(1, "r"))},
		{"a 16 MiB length prefix", []byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"nothing", nil},
		{"the magic and a short nonce", []byte(handshakeMagic + "xx")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c1, c2 := net.Pipe()
			defer c1.Close()
			go func() {
				_, _ = c1.Write(tt.send)
				_, _ = io.Copy(io.Discard, c1)
			}()
			_, err := acc.Server(context.Background(), c2, []string{"n1:8082"})
			c2.Close()
			if err == nil {
				t.Fatal("acceptor authenticated a stranger")
			}
		})
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := strings.Repeat("s", 32)
	if b, err := ReadSecretFile(write("nl", long+"\n")); err != nil || string(b) != long {
		t.Errorf("trailing newline: %q, %v", b, err)
	}
	if b, err := ReadSecretFile(write("crlf", long+"\r\n")); err != nil || string(b) != long {
		t.Errorf("trailing CRLF: %q, %v", b, err)
	}
	if _, err := ReadSecretFile(write("short", long[:31]+"\n")); err == nil {
		t.Error("a 31-byte secret was accepted")
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file was accepted")
	}
}

// testTLS makes a CA and a member certificate; other CAs make strangers.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	caCert, caKey, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := NewNodeCert(caCert, caKey, "n1", []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caCert)
	return TLSConfigs(cert, pool)
}

func TestMutualTLS(t *testing.T) {
	s1, c1 := testTLS(t)
	s2, c2 := testTLS(t) // another CA
	ours := &Auth{ServerTLS: s1, ClientTLS: c1, HandshakeTimeout: 2 * time.Second}
	theirs := &Auth{ServerTLS: s2, ClientTLS: c2, HandshakeTimeout: 2 * time.Second}
	both := &Auth{Secret: testSecret('a'), ServerTLS: s1, ClientTLS: c1, HandshakeTimeout: 2 * time.Second}
	if d, a := handshakePair(t, ours, ours); d != nil || a != nil {
		t.Fatalf("same CA: %v / %v", d, a)
	}
	if d, a := handshakePair(t, both, both); d != nil || a != nil {
		t.Fatalf("same CA and secret: %v / %v", d, a)
	}
	if _, a := handshakePair(t, theirs, ours); a == nil || !errors.Is(a, ErrAuth) {
		t.Fatalf("acceptor took a certificate of another CA: %v", a)
	}
	if d, _ := handshakePair(t, ours, theirs); d == nil || !errors.Is(d, ErrAuth) {
		t.Fatalf("dialer took a certificate of another CA: %v", d)
	}
	noCert := &Auth{ServerTLS: s1, ClientTLS: &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}, HandshakeTimeout: 2 * time.Second}
	if _, a := handshakePair(t, noCert, ours); a == nil {
		t.Fatal("acceptor took a dialer without a certificate")
	}
}

func TestAuthValidate(t *testing.T) {
	s, c := testTLS(t)
	for _, tt := range []struct {
		a  *Auth
		ok bool
	}{
		{nil, true},
		{&Auth{}, true},
		{&Auth{Secret: testSecret('a')}, true},
		{&Auth{Secret: []byte("short")}, false},
		{&Auth{ServerTLS: s}, false},
		{&Auth{ServerTLS: s, ClientTLS: c}, true},
		{&Auth{ServerTLS: &tls.Config{}, ClientTLS: c}, false},
	} {
		if err := tt.a.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v, want ok %v", tt.a, err, tt.ok)
		}
	}
}

// startGuarded serves echo behind a guarded listener.
func startGuarded(t *testing.T, lcfg ListenerConfig, scfg ServerConfig) (*Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := NewListener(ln, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(scfg, HandlerFunc(echo))
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(gl) }()
	t.Cleanup(func() { _ = s.Close(); <-done })
	return gl, ln.Addr().String()
}

func TestGuardedServerAuth(t *testing.T) {
	s1, c1 := testTLS(t)
	type refusal struct {
		dial func(context.Context, string) (net.Conn, error)
		says string // in the caller's error
	}
	for _, tc := range []struct {
		name     string
		auth     *Auth
		refusals []refusal
	}{
		{name: "secret", auth: &Auth{Secret: testSecret('a'), HandshakeTimeout: time.Second}, refusals: []refusal{
			{nil, "requires the cluster secret"},
			{(&Auth{Secret: testSecret('b')}).Dial, "does not know the cluster secret"},
		}},
		{name: "tls", auth: &Auth{ServerTLS: s1, ClientTLS: c1, HandshakeTimeout: time.Second}, refusals: []refusal{
			{nil, "requires TLS"},
			{(&Auth{Secret: testSecret('a')}).Dial, "does not speak the ringlimit handshake"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lcfg := DefaultListenerConfig()
			lcfg.Auth = tc.auth
			gl, addr := startGuarded(t, lcfg, DefaultServerConfig())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			cfg := DefaultClientConfig()
			cfg.Dial = tc.auth.Dial
			c, err := Dial(ctx, addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req, resp := batchOf(3, "r"), &BatchResponse{}
			if err := c.Do(ctx, req, resp); err != nil {
				t.Fatalf("authenticated Do: %v", err)
			}
			checkEcho(t, req, resp)

			// Without the secret or certificate: a raw frame is never
			// answered, and the caller learns why (ErrAuth): one given
			// none at all is told so by the listener (it saw only a
			// closed connection, and a router answered every check by
			// its failure mode without a word).
			for _, r := range tc.refusals {
				cfg := DefaultClientConfig()
				cfg.Dial = r.dial
				cfg.RedialBackoff = 0
				c, err := Dial(ctx, addr, cfg)
				if err == nil {
					err = c.Do(ctx, batchOf(1, "r"), &BatchResponse{})
					c.Close()
				}
				if err == nil {
					t.Fatal("a check without authentication was answered")
				}
				if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), r.says) {
					t.Fatalf("a check without authentication failed with %v, want ErrAuth saying %q", err, r.says)
				}
			}
			eventually(t, func() bool { return gl.Stats().AuthFailed == 2 })
		})
	}
}

// A connection the listener refuses (a plaintext request to a listener
// that requires the secret) is not dialed again until RedialBackoff has
// passed: calls fail at once with the refusal. Was: every call dialed
// again, a connection per frame for as long as the caller ran.
func TestAuthRefusalBacksOffLikeAFailedDial(t *testing.T) {
	lcfg := DefaultListenerConfig()
	lcfg.Auth = &Auth{Secret: testSecret('a'), HandshakeTimeout: time.Second}
	gl, addr := startGuarded(t, lcfg, DefaultServerConfig())
	var dials atomic.Int32
	cfg := DefaultClientConfig()
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	checkRedialBackoff(t, addr, cfg, &dials, ErrAuth)
	eventually(t, func() bool { return gl.Stats().AuthFailed == 2 })
}

// The cap closes connections beyond it at once, and a closed connection
// gives its slot back.
func TestListenerCaps(t *testing.T) {
	lcfg := ListenerConfig{MaxConns: 4, MaxHandshakes: 4, Auth: &Auth{HandshakeTimeout: 300 * time.Millisecond}}
	gl, addr := startGuarded(t, lcfg, DefaultServerConfig())
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually(t, func() bool { st := gl.Stats(); return st.OverCap == 6 && st.Open == 4 })
	// The silent four time out, freeing the slots.
	eventually(t, func() bool { return gl.Stats().Open == 0 })
	if st := gl.Stats(); st.Idle != 4 || st.AuthFailed != 0 || st.Accepted != 0 {
		t.Fatalf("stats %+v: want 4 timed out idle (no authentication configured), none accepted", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, DefaultClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(ctx, batchOf(1, "r"), &BatchResponse{}); err != nil {
		t.Fatalf("Do after the flood: %v", err)
	}
}

// Only a failed handshake counts as an authentication refusal: without
// authentication a connection closed before its first byte (a joining
// member's address probe) is not refused at all, and one silent for the
// handshake timeout is refused as idle. With authentication both count
// as auth failures.
func TestListenerRefusalReasons(t *testing.T) {
	for _, tc := range []struct {
		name               string
		auth               *Auth
		closed, silent     int
		wantAuth, wantIdle int64
	}{
		{"no authentication", &Auth{HandshakeTimeout: 100 * time.Millisecond}, 3, 2, 0, 2},
		{"cluster secret", &Auth{Secret: testSecret('a'), HandshakeTimeout: 100 * time.Millisecond}, 3, 2, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lcfg := DefaultListenerConfig()
			lcfg.Auth = tc.auth
			var logged atomic.Int64
			lcfg.ErrorLog = func(error) { logged.Add(1) }
			gl, addr := startGuarded(t, lcfg, DefaultServerConfig())
			for range tc.closed {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			var silent []net.Conn
			for range tc.silent {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				silent = append(silent, c)
			}
			defer func() {
				for _, c := range silent {
					c.Close()
				}
			}()
			// Accepted in order: once the silent ones are refused and
			// nothing is open, the closed ones are dealt with too.
			eventually(t, func() bool {
				st := gl.Stats()
				return st.AuthFailed+st.Idle >= tc.wantAuth+tc.wantIdle && st.Open == 0
			})
			st := gl.Stats()
			if st.AuthFailed != tc.wantAuth || st.Idle != tc.wantIdle || st.Accepted != 0 || st.OverCap != 0 {
				t.Fatalf("%d closed and %d silent connections: stats %+v, want AuthFailed %d, Idle %d",
					tc.closed, tc.silent, st, tc.wantAuth, tc.wantIdle)
			}
			if n := logged.Load(); n != tc.wantAuth+tc.wantIdle {
				t.Errorf("%d errors logged, want one per refusal (%d)", n, tc.wantAuth+tc.wantIdle)
			}
		})
	}
}

// A connection whose next frame does not arrive within IdleTimeout is
// closed by the server.
func TestServerIdleTimeout(t *testing.T) {
	scfg := DefaultServerConfig()
	scfg.IdleTimeout = 100 * time.Millisecond
	_, addr := startGuarded(t, DefaultListenerConfig(), scfg)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One byte of a frame, then silence (a slow loris).
	if _, err := c.Write([]byte{200}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read = %v, want the server to close the connection", err)
	}
}

// ReadFrame allocates as bytes arrive: a bare 16 MiB length prefix pins
// about growStep, not 16 MiB.
func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	prefix := []byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Limits{MaxFrameSize: 32 << 20}.ReadFrame(bytes.NewReader(prefix), nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 4*growStep {
		t.Fatalf("a 14-byte input allocated %d bytes", grown)
	}
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A stranger without the secret that a member dials (an address a joining
// or departed member gave) relays the member's own handshake to a
// member's port: neither the dialer nor the acceptor authenticates, and
// the stranger's connection is never answered — whether it passes the
// bytes through or rewrites the address in them to the acceptor's. Was
// (version 1, not bound to the dialed address): both authenticated, and
// the stranger held a member's connection.
func TestSecretHandshakeRefusesARelay(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		t.Run(map[bool]string{false: "passed through", true: "address rewritten"}[rewrite], func(t *testing.T) {
			auth := &Auth{Secret: testSecret('a'), HandshakeTimeout: 2 * time.Second}
			inner := pipenet.NewListener()
			gl, err := NewListener(inner, ListenerConfig{MaxConns: 8, MaxHandshakes: 8, Auth: auth, Names: []string{"n:8082"}})
			if err != nil {
				t.Fatal(err)
			}
			srv := NewServer(DefaultServerConfig(), HandlerFunc(echo))
			served := make(chan error, 1)
			go func() { served <- srv.Serve(gl) }()
			defer func() { _ = srv.Close(); <-served; _ = gl.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			// The member dials the stranger at m:9000; the stranger opens a
			// plain connection to the member's own port and relays.
			nDial, mFromN := net.Pipe()
			defer nDial.Close()
			dialerErr := make(chan error, 1)
			go func() { _, err := auth.Client(ctx, nDial, "m:9000"); dialerErr <- err }()
			mToN, err := inner.Dial(ctx, "n:8082")
			if err != nil {
				t.Fatal(err)
			}
			defer mToN.Close()
			if rewrite {
				hello := make([]byte, len(handshakeMagic)+nonceSize+2)
				if _, err := io.ReadFull(mFromN, hello); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(mFromN, make([]byte, binary.BigEndian.Uint16(hello[len(hello)-2:]))); err != nil {
					t.Fatal(err)
				}
				binary.BigEndian.PutUint16(hello[len(hello)-2:], uint16(len("n:8082")))
				if _, err := mToN.Write(append(hello, "n:8082"...)); err != nil {
					t.Fatal(err)
				}
			}
			go func() { _, _ = io.Copy(mToN, mFromN) }()
			go func() { _, _ = io.Copy(mFromN, mToN); _ = mFromN.Close() }()
			if err := <-dialerErr; !errors.Is(err, ErrAuth) {
				t.Fatalf("the member's dialer authenticated a stranger without the secret (err %v)", err)
			}
			_ = mFromN.Close()
			// The stranger's connection to the member answers no frame.
			_ = mToN.SetDeadline(time.Now().Add(time.Second))
			if _, err := mToN.Write(AppendBatchRequest(nil, 7, 0, batchOf(1, "r"))); err == nil {
				if frame, err := ReadFrame(mToN, nil); err == nil {
					t.Fatalf("the member answered a stranger's frame: %x", frame[:min(len(frame), 16)])
				}
			}
		})
	}
}

// A dialer that dialed a name the listener does not answer to is
// refused (and says which), and so is a member of the earlier release,
// whose handshake had no dialed address.
func TestSecretHandshakeNamesAndVersion(t *testing.T) {
	auth := &Auth{Secret: testSecret('a'), HandshakeTimeout: time.Second}
	c1, c2 := net.Pipe()
	go func() { _, _ = auth.Client(context.Background(), c1, "other:8082"); c1.Close() }()
	_, err := auth.Server(context.Background(), c2, []string{"n1:8082", "10.0.0.1:8082"})
	c2.Close()
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), `dialed "other:8082"`) {
		t.Errorf("a dialer of another name: %v; want ErrAuth naming it", err)
	}
	o1, o2 := net.Pipe()
	go func() {
		_, _ = o1.Write([]byte("RLAUTH\x01\x00" + strings.Repeat("n", nonceSize)))
		_, _ = io.Copy(io.Discard, o1)
	}()
	_, err = auth.Server(context.Background(), o2, []string{"n1:8082"})
	o1.Close()
	o2.Close()
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "version 1") {
		t.Errorf("a version 1 dialer: %v; want ErrAuth saying version 1", err)
	}
	// Either of a listener's names will do.
	s1, s2 := net.Pipe()
	dErr := make(chan error, 1)
	go func() { _, err := auth.Client(context.Background(), s1, "10.0.0.1:8082"); dErr <- err }()
	if _, err := auth.Server(context.Background(), s2, []string{"n1:8082", "10.0.0.1:8082"}); err != nil || <-dErr != nil {
		t.Errorf("dialed by its second name: acceptor %v", err)
	}
	s1.Close()
	s2.Close()
}

// The longest DNS name (253 bytes) with a port, 259 bytes, is dialed and
// accepted. Was refused by the dialer: the address's length had one byte.
func TestSecretHandshakeLongHostName(t *testing.T) {
	label := strings.Repeat("a", 63)
	addr := net.JoinHostPort(strings.Join([]string{label, label, label, strings.Repeat("b", 61)}, "."), "38081")
	a := &Auth{Secret: testSecret('s'), HandshakeTimeout: time.Second}
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	aErr := make(chan error, 1)
	go func() { _, err := a.Server(context.Background(), c2, []string{addr}); aErr <- err }()
	if _, err := a.Client(context.Background(), c1, addr); err != nil || <-aErr != nil {
		t.Fatalf("a %d-byte address: dialer %v", len(addr), err)
	}
}
