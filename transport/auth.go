package transport

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

// Connection authentication.
//
// Every inter-node connection (Raft, the data plane and whatever frame
// types travel on it later: hand-off, backup streams) is authenticated
// once, when it opens, before a single frame or RPC byte is read: first
// mutual TLS (when configured), then the cluster-secret handshake (when
// configured). Both are connection-level, so a new frame type needs
// nothing to be authenticated.
//
// The secret handshake is a mutual HMAC-SHA256 challenge–response with
// bounded sizes (so reading it allocates nothing an attacker controls),
// bound to the address the dialer dialed:
//
//	dialer   → acceptor  magic(8) nonceD(32) len(2, big-endian) addr(len)
//	acceptor → dialer    magic(8) nonceA(32) HMAC(secret, "ringlimit acceptor v2" ‖ len ‖ addr ‖ nonceD ‖ nonceA)
//	dialer   → acceptor  HMAC(secret, "ringlimit dialer v2" ‖ len ‖ addr ‖ nonceD ‖ nonceA)
//	acceptor → dialer    0x01 (accepted)
//
// addr is the address the dialer dialed (host:port, as it was given to
// Dial); the acceptor refuses one that is not among its own names (the
// listener's advertised address). Each side proves the secret on a
// challenge the other chose fresh, so a recorded exchange cannot be
// replayed, and the two roles use distinct labels. The binding to addr
// stops a relay: a stranger that a member dials (a joining member's
// address, an address a departed member had) could otherwise pass the
// member's own handshake through to any member's port, or back to the
// dialer's, and hold an authenticated connection without the secret —
// the first version of this handshake had no such binding and allowed
// exactly that. Relayed, the dialer's proof names the stranger's address,
// which no member answers to, and a rewritten address breaks both
// proofs. The secret authenticates the start of a connection only;
// against an attacker on the network path (who could take over an
// authenticated TCP stream, or answer at a member's own address), use
// TLS.

const (
	handshakeMagic = "RLAUTH\x02\x00" // version 2: bound to the dialed address (version 1 was not)
	nonceSize      = 32
	macSize        = sha256.Size
	handshakeOK    = 0x01
	maxAddrLen     = 512 // the dialed address's length: two bytes on the wire; a DNS host:port is at most 261

	// MinSecretSize is the shortest cluster secret accepted.
	MinSecretSize = 32
	// DefaultHandshakeTimeout bounds a connection's authentication.
	DefaultHandshakeTimeout = 5 * time.Second
)

// ErrAuth is wrapped by every error of a connection whose peer failed to
// authenticate (wrong or missing secret, a certificate of another CA, or
// bytes that are not a handshake).
var ErrAuth = errors.New("transport: peer not authenticated")

// Auth says how inter-node connections authenticate. A nil *Auth, or one
// with neither Secret nor TLS, authenticates nothing (--insecure, or
// loopback). It is immutable once in use and safe for concurrent use.
type Auth struct {
	// Secret is the cluster's shared secret (at least MinSecretSize bytes);
	// nil disables the secret handshake.
	Secret []byte
	// ServerTLS is the acceptor's TLS configuration (it must require and
	// verify client certificates); ClientTLS the dialer's. Both nil
	// disables TLS; both must be set together.
	ServerTLS, ClientTLS *tls.Config
	// HandshakeTimeout bounds TLS plus the secret handshake of one
	// connection; 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// Enabled reports whether a connection must authenticate.
func (a *Auth) Enabled() bool {
	return a != nil && (a.Secret != nil || a.ServerTLS != nil || a.ClientTLS != nil)
}

// Validate reports whether a is usable. It changes nothing.
func (a *Auth) Validate() error {
	if a == nil {
		return nil
	}
	if a.Secret != nil && len(a.Secret) < MinSecretSize {
		return fmt.Errorf("%w: cluster secret of %d bytes, want at least %d", ErrInvalidConfig, len(a.Secret), MinSecretSize)
	}
	if (a.ServerTLS == nil) != (a.ClientTLS == nil) {
		return fmt.Errorf("%w: TLS needs both a server and a client configuration", ErrInvalidConfig)
	}
	if a.ServerTLS != nil && a.ServerTLS.ClientAuth != tls.RequireAndVerifyClientCert {
		return fmt.Errorf("%w: server TLS must require and verify client certificates", ErrInvalidConfig)
	}
	if a.HandshakeTimeout < 0 {
		return fmt.Errorf("%w: HandshakeTimeout %v is negative", ErrInvalidConfig, a.HandshakeTimeout)
	}
	return nil
}

func (a *Auth) timeout() time.Duration {
	if a == nil || a.HandshakeTimeout <= 0 {
		return DefaultHandshakeTimeout
	}
	return a.HandshakeTimeout
}

// ReadSecretFile reads a cluster secret: the file's bytes, one trailing
// newline (LF or CRLF) ignored, at least MinSecretSize bytes.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("transport: cluster secret: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) < MinSecretSize {
		return nil, fmt.Errorf("transport: cluster secret %s: %d bytes, want at least %d", path, len(b), MinSecretSize)
	}
	return b, nil
}

// Dial opens a TCP connection to addr and authenticates it as the dialer
// (Auth.Client, bound to addr). It fits ClientConfig.Dial.
func (a *Auth) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := a.Client(ctx, nc, addr)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

// Client authenticates nc, dialed at addr, as the dialing side and
// returns the connection to use (a *tls.Conn with TLS). On error the
// caller closes nc. The handshake is bounded by ctx and HandshakeTimeout.
func (a *Auth) Client(ctx context.Context, nc net.Conn, addr string) (net.Conn, error) {
	if !a.Enabled() {
		return nc, nil
	}
	return a.handshake(ctx, nc, true, addr, nil)
}

// Server authenticates nc as the accepting side of a listener reached by
// the addresses names (with a cluster secret, a dialer that dialed any
// other is refused); see Client.
func (a *Auth) Server(ctx context.Context, nc net.Conn, names []string) (net.Conn, error) {
	if !a.Enabled() {
		return nc, nil
	}
	return a.handshake(ctx, nc, false, "", names)
}

func (a *Auth) handshake(ctx context.Context, nc net.Conn, dialer bool, addr string, names []string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout())
	defer cancel()
	deadline, _ := ctx.Deadline()
	if err := nc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	// A context that ends early (Close of the listener, a caller giving
	// up) interrupts blocked reads and writes.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	c, err := a.handshakeConn(ctx, nc, dialer, addr, names)
	if !stop() {
		if err == nil {
			err = ctx.Err()
		}
	} else if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		return nil, fmt.Errorf("transport: handshake with %v: %w", nc.RemoteAddr(), err)
	}
	return c, nil
}

func (a *Auth) handshakeConn(ctx context.Context, nc net.Conn, dialer bool, addr string, names []string) (net.Conn, error) {
	c := nc
	if a.ServerTLS != nil {
		var tc *tls.Conn
		if dialer {
			tc = tls.Client(nc, a.ClientTLS)
		} else {
			tc = tls.Server(nc, a.ServerTLS)
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			var rh tls.RecordHeaderError
			if !dialer && errors.As(err, &rh) && rh.Conn != nil {
				// Not TLS at all: a ringlimit peer given no certificate
				// (see authRequired) is told why, in plain text.
				_, _ = rh.Conn.Write(tlsRequired)
			}
			return nil, fmt.Errorf("%w: tls: %w", ErrAuth, err)
		}
		c = tc
	}
	if a.Secret != nil {
		var err error
		if dialer {
			err = secretDialer(c, a.Secret, addr)
		} else {
			err = secretAcceptor(c, a.Secret, names)
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

func proof(secret []byte, label, addr string, nonceD, nonceA []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(binary.BigEndian.AppendUint16(nil, uint16(len(addr))))
	m.Write([]byte(addr))
	m.Write(nonceD)
	m.Write(nonceA)
	return m.Sum(nil)
}

const (
	labelAcceptor = "ringlimit acceptor v2"
	labelDialer   = "ringlimit dialer v2"
)

// readHandshake reads exactly len(buf) bytes; an early EOF or foreign
// bytes are the peer failing to authenticate.
func readHandshake(rw io.Reader, buf []byte) error {
	if _, err := io.ReadFull(rw, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: connection closed during the handshake", ErrAuth)
		}
		return err
	}
	return nil
}

// authRequired and tlsRequired are the error frames (request id 0: the
// connection's) that answer a peer that sent a request without the
// secret's handshake, or bytes that are not TLS to a port that requires
// it.
var (
	authRequired = AppendError(nil, 0, CodeAuth, "this port requires the cluster secret: give the dialing side --cluster-secret")
	tlsRequired  = AppendError(nil, 0, CodeAuth, "this port requires TLS with a certificate of the cluster's CA: give the dialing side --tls-cert, --tls-key and --tls-ca")
)

// isRequestHeader reports whether b, a connection's first 8 bytes, begin
// a ringlimit request frame: a version this package writes and a request
// frame type.
func isRequestHeader(b []byte) bool {
	v, t := b[4], FrameType(b[5])
	return v >= ProtocolVersion && v <= JoinedVersion && (t == FrameBatchRequest || t == FramePushRequest)
}

// errOldHandshake: the peer speaks version 1 of the handshake (a member
// of an earlier release), which this one no longer accepts.
var errOldHandshake = fmt.Errorf("%w: the peer speaks version 1 of the ringlimit handshake (an earlier release): upgrade it", ErrAuth)

func checkMagic(m []byte) error {
	switch {
	case string(m) == handshakeMagic:
		return nil
	case string(m) == "RLAUTH\x01\x00":
		return errOldHandshake
	}
	return fmt.Errorf("%w: the peer does not speak the ringlimit handshake", ErrAuth)
}

func secretDialer(rw io.ReadWriter, secret []byte, addr string) error {
	if len(addr) == 0 || len(addr) > maxAddrLen {
		return fmt.Errorf("%w: dialed address of %d bytes (want 1 to %d)", ErrInvalidConfig, len(addr), maxAddrLen)
	}
	var out [len(handshakeMagic) + nonceSize + 2 + maxAddrLen]byte
	copy(out[:], handshakeMagic)
	nonceD := out[len(handshakeMagic) : len(handshakeMagic)+nonceSize]
	_, _ = rand.Read(nonceD) // crypto/rand.Read never fails (Go ≥ 1.24)
	binary.BigEndian.PutUint16(out[len(handshakeMagic)+nonceSize:], uint16(len(addr)))
	n := copy(out[len(handshakeMagic)+nonceSize+2:], addr)
	if _, err := rw.Write(out[:len(handshakeMagic)+nonceSize+2+n]); err != nil {
		return err
	}
	var in [len(handshakeMagic) + nonceSize + macSize]byte
	if err := readHandshake(rw, in[:]); err != nil {
		return err
	}
	if err := checkMagic(in[:len(handshakeMagic)]); err != nil {
		return err
	}
	nonceA := in[len(handshakeMagic) : len(handshakeMagic)+nonceSize]
	if !hmac.Equal(in[len(handshakeMagic)+nonceSize:], proof(secret, labelAcceptor, addr, nonceD, nonceA)) {
		return fmt.Errorf("%w: the peer does not know the cluster secret (or is not the member at %s)", ErrAuth, addr)
	}
	if _, err := rw.Write(proof(secret, labelDialer, addr, nonceD, nonceA)); err != nil {
		return err
	}
	var ok [1]byte
	if err := readHandshake(rw, ok[:]); err != nil {
		return fmt.Errorf("%w (the peer refused our proof of the cluster secret, or %s is not its address, or it closed the handshake to make room at its connection cap: see its ringlimit_listener_refused_total{reason=\"cap\"})", err, addr)
	}
	if ok[0] != handshakeOK {
		return fmt.Errorf("%w: the peer refused the handshake", ErrAuth)
	}
	return nil
}

func secretAcceptor(rw io.ReadWriter, secret []byte, names []string) error {
	var in [len(handshakeMagic) + nonceSize + 2]byte
	if err := readHandshake(rw, in[:len(handshakeMagic)]); err != nil {
		return err
	}
	if err := checkMagic(in[:len(handshakeMagic)]); err != nil {
		if isRequestHeader(in[:len(handshakeMagic)]) {
			// A ringlimit peer given no secret (a router or gateway
			// started without --cluster-secret): say why it is refused,
			// or it sees only a closed connection and answers every
			// check by its failure mode without knowing why.
			_, _ = rw.Write(authRequired)
			err = fmt.Errorf("%w: the peer sent a request without the handshake (it has no cluster secret)", ErrAuth)
		}
		return err
	}
	if err := readHandshake(rw, in[len(handshakeMagic):]); err != nil {
		return err
	}
	nonceD := in[len(handshakeMagic) : len(handshakeMagic)+nonceSize]
	var addrBuf [maxAddrLen]byte
	n := int(binary.BigEndian.Uint16(in[len(handshakeMagic)+nonceSize:]))
	if n == 0 || n > maxAddrLen {
		return fmt.Errorf("%w: a dialed address of %d bytes (want 1 to %d)", ErrAuth, n, maxAddrLen)
	}
	addrB := addrBuf[:n]
	if err := readHandshake(rw, addrB); err != nil {
		return err
	}
	addr := string(addrB)
	if !slices.Contains(names, addr) {
		return fmt.Errorf("%w: the peer dialed %q, which is not this listener's address (%s): a relay, or a member that knows it by another name", ErrAuth, truncateAddr(addr), strings.Join(names, ", "))
	}
	var out [len(handshakeMagic) + nonceSize + macSize]byte
	copy(out[:], handshakeMagic)
	nonceA := out[len(handshakeMagic) : len(handshakeMagic)+nonceSize]
	_, _ = rand.Read(nonceA)
	copy(out[len(handshakeMagic)+nonceSize:], proof(secret, labelAcceptor, addr, nonceD, nonceA))
	if _, err := rw.Write(out[:]); err != nil {
		return err
	}
	var mac [macSize]byte
	if err := readHandshake(rw, mac[:]); err != nil {
		return err
	}
	if !hmac.Equal(mac[:], proof(secret, labelDialer, addr, nonceD, nonceA)) {
		return fmt.Errorf("%w: the peer does not know the cluster secret", ErrAuth)
	}
	_, err := rw.Write([]byte{handshakeOK})
	return err
}

// truncateAddr cuts a peer-chosen address for a message.
func truncateAddr(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
