package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/transport"
)

// securityFlags are the inter-node authentication flags of serve (and of
// every process that dials the data plane).
type securityFlags struct {
	secret, cert, key, ca *string
	insecure              *bool
}

func addSecurityFlags(fs *flag.FlagSet) securityFlags {
	return securityFlags{
		secret:   fs.String("cluster-secret", "", "file holding the cluster's shared secret (≥ 32 bytes): every Raft and data-plane connection proves it"),
		cert:     fs.String("tls-cert", "", "this member's TLS certificate (PEM) for mutual TLS on Raft and the data plane"),
		key:      fs.String("tls-key", "", "the key of --tls-cert (PEM)"),
		ca:       fs.String("tls-ca", "", "the cluster CA (PEM): peers must present a certificate it signed"),
		insecure: fs.Bool("insecure", false, "allow --raft/--peer on a non-loopback address with neither --cluster-secret nor TLS"),
	}
}

// addDialerSecurityFlags are the security flags of bench, which only
// dials the owners' data plane (--protocol peer). --insecure is kept so
// that a command line or environment shared with serve still parses,
// but it has no effect: bench listens on nothing.
func addDialerSecurityFlags(fs *flag.FlagSet) securityFlags {
	return securityFlags{
		secret:   fs.String("cluster-secret", "", "--protocol peer: file holding the cluster's shared secret (≥ 32 bytes): data-plane connections to the owners prove it"),
		cert:     fs.String("tls-cert", "", "--protocol peer: certificate (PEM) for mutual TLS to the owners' data plane"),
		key:      fs.String("tls-key", "", "the key of --tls-cert (PEM)"),
		ca:       fs.String("tls-ca", "", "--protocol peer: the cluster CA (PEM): owners must present a certificate it signed"),
		insecure: fs.Bool("insecure", false, "no effect (bench listens on nothing; without --cluster-secret or TLS it dials the owners unauthenticated)"),
	}
}

// auth builds the inter-node authentication from the flags, and refuses
// an unauthenticated cluster reachable from other hosts unless
// --insecure says so.
func (f securityFlags) auth(log *slog.Logger, listen ...string) (*transport.Auth, error) {
	a := &transport.Auth{}
	str := func(p *string) string { // flags not registered (tests) are empty
		if p == nil {
			return ""
		}
		return *p
	}
	if secret := str(f.secret); secret != "" {
		s, err := transport.ReadSecretFile(secret)
		if err != nil {
			return nil, fmt.Errorf("--cluster-secret: %w", err)
		}
		a.Secret = s
	}
	switch n := nonEmpty(str(f.cert), str(f.key), str(f.ca)); n {
	case 0:
	case 3:
		srv, cli, err := transport.LoadTLS(*f.cert, *f.key, *f.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-ca: %w", err)
		}
		a.ServerTLS, a.ClientTLS = srv, cli
	default:
		return nil, errors.New("--tls-cert, --tls-key and --tls-ca go together: give all three or none")
	}
	if a.Enabled() {
		return a, nil
	}
	var exposed []string
	for _, l := range listen {
		if l != "" && !loopbackListen(hostPort(l)) {
			exposed = append(exposed, l)
		}
	}
	if len(exposed) > 0 {
		if f.insecure == nil || !*f.insecure {
			return nil, fmt.Errorf("--raft/--peer listen on %s, reachable from other hosts, but neither --cluster-secret nor --tls-cert/--tls-key/--tls-ca is set: anybody could join Raft and spend any key's budget; set one of them, or --insecure to accept that", strings.Join(exposed, ", "))
		}
		log.Warn("--insecure: Raft and the data plane accept unauthenticated connections from other hosts", "listen", exposed)
	}
	return nil, nil
}

func nonEmpty(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// loopbackListen reports whether a listen address is loopback only.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// runCerts makes a test CA, a certificate per member and a cluster secret.
func runCerts(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("certs", stderr)
	var (
		dir      = fs.String("dir", "ringlimit-certs", "directory to write into (created; existing files are not overwritten)")
		nodes    = fs.String("nodes", "n1,n2,n3", "comma-separated member names: one certificate each")
		hosts    = fs.String("hosts", "127.0.0.1,::1,localhost", "comma-separated names and IPs put in every certificate")
		validFor = fs.Duration("valid-for", 365*24*time.Hour, "validity of the CA and the certificates")
	)
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "ringlimit certs: %v\n", err)
		return 2
	}
	if *validFor < time.Hour {
		return fail(fmt.Errorf("--valid-for: at least 1h, got %v (certificates are backdated by an hour, so less would be born expired)", *validFor))
	}
	names := splitList(*nodes)
	if err := checkCertNames(names); err != nil {
		return fail(fmt.Errorf("--nodes: %w", err))
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fail(err)
	}
	// Every file or none: one that exists already is refused before
	// anything is written (was: written one by one, leaving a partial,
	// mismatched set behind).
	files := []string{"ca.pem", "ca-key.pem", "cluster.secret"}
	for _, n := range names {
		files = append(files, n+".pem", n+"-key.pem")
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(*dir, f)); err == nil {
			return fail(fmt.Errorf("%s exists already: give another --dir, or remove the old set", filepath.Join(*dir, f)))
		}
	}
	write := func(name string, b []byte, mode os.FileMode) error {
		f, err := os.OpenFile(filepath.Join(*dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	caCert, caKey, err := transport.NewCA("ringlimit test CA", *validFor)
	if err != nil {
		return fail(err)
	}
	if err := write("ca.pem", caCert, 0o644); err != nil {
		return fail(err)
	}
	if err := write("ca-key.pem", caKey, 0o600); err != nil {
		return fail(err)
	}
	hs := splitList(*hosts)
	for _, n := range names {
		cert, key, err := transport.NewNodeCert(caCert, caKey, n, append([]string{n}, hs...), *validFor)
		if err != nil {
			return fail(err)
		}
		if err := write(n+".pem", cert, 0o644); err != nil {
			return fail(err)
		}
		if err := write(n+"-key.pem", key, 0o600); err != nil {
			return fail(err)
		}
	}
	if err := write("cluster.secret", []byte(randomHex(32)+"\n"), 0o600); err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "wrote ca.pem, ca-key.pem, cluster.secret and a certificate per member (%s) to %s\n", *nodes, *dir)
	fmt.Fprintf(stdout, "serve with: --tls-ca %[1]s/ca.pem --tls-cert %[1]s/NAME.pem --tls-key %[1]s/NAME-key.pem and/or --cluster-secret %[1]s/cluster.secret\n", *dir)
	return 0
}

// checkCertNames refuses member names that are no file name of their own
// in --dir (a path, "..", a name of the CA's or the secret's files) and
// repeats.
func checkCertNames(names []string) error {
	if len(names) == 0 {
		return errors.New("no member names")
	}
	seen := map[string]bool{}
	for _, n := range names {
		switch {
		case n == "." || n == ".." || strings.ContainsFunc(n, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
		}):
			return fmt.Errorf("member name %q: letters, digits, '-', '_' and '.' only (it names files in --dir and a DNS name in its certificate)", n)
		case n == "ca" || n == "ca-key" || n == "cluster":
			return fmt.Errorf("member name %q is taken by the CA's or the secret's files", n)
		case strings.HasSuffix(n, "-key") && seen[strings.TrimSuffix(n, "-key")], seen[n+"-key"]:
			return fmt.Errorf("member name %q collides with another's key file", n)
		case seen[n]:
			return fmt.Errorf("member name %q given twice", n)
		}
		seen[n] = true
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// randomHex returns n random bytes, hex-encoded: a cluster secret (certs)
// or an embedded member's own token and secret (gateway).
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b)
}
