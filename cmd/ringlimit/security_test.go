package main

import (
	"bufio"
	"bytes"
	binenc "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// runToExit runs `ringlimit args...` and returns its exit code and stderr.
func runToExit(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), errb.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, errb.String()
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("ringlimit %v still running after 30s; stderr:\n%s", args, errb.String())
		return 0, ""
	}
}

// Each damaged data dir stops serve with exit 1 and a message naming the
// file: never a panic, never a SIGBUS, never a new cluster.
func TestServeCorruptDataExits1(t *testing.T) {
	bin := binary(t)
	src := t.TempDir()
	p := startServe(t, "n1", src)
	if code, _ := send(t, "PUT", p.http, "/v1/rules", "application/json", `{"rules":[{"name":"r","algorithm":"token_bucket","limit":5,"period":"1s"}]}`); code != 200 {
		t.Fatalf("PUT rules: %d", code)
	}
	p.stop(t)
	db, err := os.ReadFile(filepath.Join(src, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	for _, tc := range []struct {
		name string
		data func() []byte
		want string
	}{
		{"empty", func() []byte { return nil }, "empty (0 bytes)"},
		// Cut within the pages the header says are in use (its page
		// count, pgid): half the file is not always that, as bolt grows
		// the file ahead of its pages (was db[:len(db)/2], which kept
		// every page in use once the log's layout changed).
		{"truncated", func() []byte { return db[:(int(newestMeta(db).pgid)-1)*page] }, "truncated"},
		{"meta pages corrupt", func() []byte {
			b := bytes.Clone(db)
			copy(b[16+20:], "XXXX")
			copy(b[page+16+20:], "XXXX")
			return b
		}, "checksum"},
		{"pages overwritten", func() []byte {
			b := bytes.Clone(db)
			for off := 2 * page; off+12 <= len(b); off += page {
				copy(b[off:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x10, 0, 0xff, 0xff})
			}
			return b
		}, "corrupt"},
		// The freelist's count: bolt reads that page only when it opens the
		// file for writing; was a SIGSEGV in its freelist load.
		{"freelist count corrupt", func() []byte {
			b := bytes.Clone(db)
			copy(b[int(newestMeta(db).freelist)*page+10:], []byte{0xff, 0xfe})
			return b
		}, "freelist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "raft.db")
			if err := os.WriteFile(path, tc.data(), 0o600); err != nil {
				t.Fatal(err)
			}
			code, errs := runToExit(t, bin, "serve", "--id", "n1", "--http", freePort(t), "--raft", freePort(t), "--peer", freePort(t), "--data-dir", dir)
			if code != 1 || !strings.Contains(errs, path) || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 naming %s and saying %q", code, lastLines(errs, 10), path, tc.want)
			}
			if strings.Contains(errs, "panic") || strings.Contains(errs, "SIGBUS") || strings.Contains(errs, "bootstrapped") {
				t.Fatalf("stderr:\n%s", errs)
			}
		})
	}
}

// A data dir a member ran in whose raft.db is gone (deleted, or a symlink
// to a volume not mounted) stops serve with exit 1 naming it. Was: taken
// for a new member's, which bootstrapped a new cluster (and loaded the old
// one's bucket file into it).
func TestServeRefusesADataDirWithoutItsRaftDB(t *testing.T) {
	bin := binary(t)
	for _, tc := range []struct {
		name string
		make func(dir string) error
		want string
	}{
		{"raft.db deleted, the bucket file left", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "buckets.rlsnap"), []byte("RLSNAP2\n"), 0o600)
		}, "buckets.rlsnap of a member that ran here"},
		{"raft.db a dangling symlink", func(dir string) error {
			return os.Symlink(filepath.Join(dir, "unmounted", "raft.db"), filepath.Join(dir, "raft.db"))
		}, "symlink to a file that does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.make(dir); err != nil {
				t.Fatal(err)
			}
			code, errs := runToExit(t, bin, "serve", "--id", "n1", "--http", freePort(t), "--raft", freePort(t), "--peer", freePort(t), "--data-dir", dir)
			if code != 1 || !strings.Contains(errs, "raft.db") || !strings.Contains(errs, tc.want) || strings.Contains(errs, "bootstrapped") {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 naming raft.db and saying %q", code, lastLines(errs, 10), tc.want)
			}
		})
	}
}

func TestServeRefusesExposedWithoutAuth(t *testing.T) {
	bin := binary(t)
	_, port, _ := net.SplitHostPort(freePort(t))
	code, errs := runToExit(t, bin, "serve", "--id", "n1", "--http", freePort(t), "--raft", "0.0.0.0:"+port, "--peer", freePort(t),
		"--advertise-host", "127.0.0.1", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(errs, "--cluster-secret") || !strings.Contains(errs, "--insecure") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 2 naming the flags", code, errs)
	}
	code, errs = runToExit(t, bin, "serve", "--tls-cert", "x.pem", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(errs, "go together") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 2 about the TLS flags", code, errs)
	}
}

// A cluster of real processes with a cluster secret (made by ringlimit
// certs); a process with another secret cannot join it, and one with the
// secret can.
func TestServeClusterSecret(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	if code, errs := runToExit(t, bin, "certs", "--dir", dir, "--nodes", "n1,n2"); code != 0 {
		t.Fatalf("certs: %d %s", code, errs)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "n1.pem", "n1-key.pem", "n2.pem", "n2-key.pem", "cluster.secret"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(t.TempDir(), "other.secret")
	if err := os.WriteFile(other, []byte(strings.Repeat("o", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "cluster.secret")
	tlsFlags := func(n string) []string {
		return []string{"--cluster-secret", secret, "--tls-ca", filepath.Join(dir, "ca.pem"),
			"--tls-cert", filepath.Join(dir, n+".pem"), "--tls-key", filepath.Join(dir, n+"-key.pem")}
	}
	n1 := startServe(t, "n1", t.TempDir(), tlsFlags("n1")...)
	stranger := launchServe(t, "stranger", t.TempDir(), "--join", n1.http, "--cluster-secret", other)
	waitFor(t, "the stranger's join refused", func() bool {
		return strings.Contains(stranger.log.String(), "cannot reach the joining member")
	})
	// n2's forwards get a loaded machine's budget: what is tested here is
	// who may talk to whom, not latency (a 250 ms stall under a -race CI
	// run answered one check degraded).
	n2 := startServe(t, "n2", t.TempDir(), append(append(tlsFlags("n2"), "--join", n1.http), loadedBudgets...)...)
	var c api.Cluster
	waitFor(t, "two members", func() bool { return get(n2.http, "/v1/cluster", &c) == 200 && len(c.Members) == 2 })
	for _, m := range c.Members {
		if m.ID == "stranger" {
			t.Fatal("the stranger is a member")
		}
	}
	if get(stranger.http, "/readyz", nil) == 200 {
		t.Fatal("the stranger is ready")
	}
	// Checks through either member, and through a stateless router with
	// the cluster's flags, reach the owner over the authenticated data
	// plane; a router without them only gets degraded answers.
	router := func(forwardTimeout string, extra ...string) (string, *logbuf.Buffer) {
		addr := freePort(t)
		cmd := exec.Command(bin, append([]string{"router", "--http", addr, "--cluster", n1.http, "--forward-timeout", forwardTimeout}, extra...)...)
		log := &logbuf.Buffer{}
		cmd.Stderr = log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("router log:\n%s", lastLines(log.String(), 20))
			}
		})
		waitFor(t, "router ready", func() bool { return get(addr, "/readyz", nil) == 200 })
		return addr, log
	}
	good, _ := router("5s", tlsFlags("n2")...)
	bad, _ := router("300ms", "--cluster-secret", other) // refused at once, then degraded
	none, noneLog := router("300ms")                     // no secret, no certificate
	for i := range 20 {
		body := fmt.Sprintf(`{"rule":"default","key":"k%d"}`, i)
		for _, via := range []string{n2.http, good} {
			if code, resp := send(t, "POST", via, "/v1/check", "application/json", body); code != 200 || bytes.Contains(resp, []byte(`"degraded":true`)) {
				t.Fatalf("check %d via %s: %d %s", i, via, code, resp)
			}
		}
		for _, via := range []string{bad, none} {
			if code, resp := send(t, "POST", via, "/v1/check", "application/json", body); code != 200 || !bytes.Contains(resp, []byte(`"degraded":true`)) {
				t.Fatalf("check %d via a router with another secret or none: %d %s; want a degraded answer", i, code, resp)
			}
		}
	}
	// Neither side keeps quiet about it (they said nothing above DEBUG):
	// the router names the flags it lacks, the member the refusal.
	waitFor(t, "the router without a certificate saying why", func() bool {
		return strings.Contains(noneLog.String(), `"level":"WARN"`) && strings.Contains(noneLog.String(), "--tls-cert")
	})
	waitFor(t, "n1 saying it refused a connection", func() bool {
		return strings.Contains(n1.log.String(), "refused an inter-node connection that did not authenticate")
	})
	// So does bench over the data plane: its run ends as before (exit 0),
	// but stderr says how many checks were degraded, and why.
	code, errs := runToExit(t, bin, "bench", "--protocol", "peer", "--addr", n1.http, "--requests", "20", "--concurrency", "2")
	if code != 0 || !strings.Contains(errs, "20 of 20 checks (100.0%) were answered degraded") || !strings.Contains(errs, "--tls-cert") {
		t.Fatalf("bench without a certificate: exit %d, stderr:\n%s\nwant exit 0 and lines saying every check was degraded, and why", code, errs)
	}
}

// Browser-borne admin requests and invalid UTF-8 keys, on a real process.
func TestServeHostileHTTP(t *testing.T) {
	p := startServe(t, "n1", t.TempDir())
	if code, body := send(t, "POST", p.http, "/v1/cluster/leave", "text/plain", `{"id":"n1"}`, "Origin", "https://evil.example"); code != 403 {
		t.Fatalf("browser-borne leave: %d %s", code, body)
	}
	req := "GET /v1/cluster/view HTTP/1.1\r\nHost: rebind.example:8080\r\nConnection: close\r\n\r\n"
	c, err := net.Dial("tcp", p.http)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, req)
	status, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(status, " 403 ") {
		t.Fatalf("DNS-rebound view: %q", status)
	}
	for _, body := range []string{"{\"rule\":\"default\",\"key\":\"t\xff\"}", `{"rule":"default","key":"t\udc00"}`} {
		if code, b := send(t, "POST", p.http, "/v1/check", "application/json", body); code != 400 || !bytes.Contains(b, []byte("UTF-8")) {
			t.Fatalf("%q: %d %s", body, code, b)
		}
	}
	// n1 is still the one member (the view /v1/cluster shows may trail
	// readiness by a moment after start).
	waitFor(t, "n1 listed as the one member", func() bool {
		var cl api.Cluster
		return get(p.http, "/v1/cluster", &cl) == 200 && len(cl.Members) == 1 && cl.Members[0].ID == "n1"
	})
}

// --- floods ----------------------------------------------------------

var (
	plainOnce sync.Once
	plainPath string
	plainErr  error
)

// plainBinary is the binary without the race detector, whose shadow
// memory would make RSS figures meaningless.
func plainBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	plainOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ringlimit-plain")
		if err != nil {
			plainErr = err
			return
		}
		plainPath = filepath.Join(dir, "ringlimit")
		out, err := exec.Command("go", "build", "-o", plainPath, ".").CombinedOutput()
		if err != nil {
			plainErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if plainErr != nil {
		t.Fatal(plainErr)
	}
	return plainPath
}

func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// metric reads one sample of /metrics ("name{labels}" as printed).
func metric(addr, sample string) float64 {
	resp, err := httpc.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return -1
}

const maxRSSGrowth = 64 << 20

// The floods of the issue, with its figures, on a real process: 150
// connections each sending a 16 MiB length prefix (to the data plane and
// to Raft), then 10,000 idle connections. RSS must grow less than 64 MiB
// and /healthz keep answering.
func TestServeFloods(t *testing.T) {
	bin := plainBinary(t)
	p := &proc{id: "n1", http: freePort(t), dir: t.TempDir(), done: make(chan struct{})}
	raftAddr, peerAddr := freePort(t), freePort(t)
	p.cmd = exec.Command(bin, "serve", "--id", "n1", "--http", p.http, "--raft", raftAddr, "--peer", peerAddr, "--data-dir", p.dir)
	p.log = &logbuf.Buffer{}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop(t) })
	waitFor(t, "ready", func() bool { return get(p.http, "/readyz", nil) == 200 })
	healthy := func() bool {
		c := *httpc
		c.Timeout = 2 * time.Second
		resp, err := c.Get("http://" + p.http + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	base := rssBytes(t, p.cmd.Process.Pid)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	prefix := []byte{0xfc, 0xff, 0xff, 0x00, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0} // a 16 MiB frame, then nothing
	peak := base
	// seen counts the connections a listener has dealt with.
	seen := func(name string) float64 {
		return metric(p.http, `ringlimit_listener_accepted_total{listener="`+name+`"}`) +
			metric(p.http, `ringlimit_listener_refused_total{listener="`+name+`",reason="cap"}`) +
			metric(p.http, `ringlimit_listener_refused_total{listener="`+name+`",reason="auth"}`) +
			metric(p.http, `ringlimit_listener_refused_total{listener="`+name+`",reason="idle"}`)
	}
	for _, target := range []struct{ name, addr string }{{"peer", peerAddr}, {"raft", raftAddr}} {
		before := seen(target.name)
		for range 150 {
			c, err := net.Dial("tcp", target.addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			_, _ = c.Write(prefix)
		}
		waitFor(t, "150 connections seen on "+target.name, func() bool { return seen(target.name)-before >= 150 })
		peak = max(peak, rssBytes(t, p.cmd.Process.Pid))
		if !healthy() {
			t.Fatalf("/healthz does not answer during the %s prefix flood", target.name)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]

	const idle = 10000
	n := idle
	if raceEnabled {
		n = 2000 // the race detector's per-goroutine cost in this process
	}
	before := seen("peer")
	for len(conns) < n {
		c, err := net.DialTimeout("tcp", peerAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	// Idle connections are either still waiting for their first byte
	// (open) or already dealt with.
	waitFor(t, fmt.Sprintf("%d idle connections seen", n), func() bool {
		return metric(p.http, `ringlimit_listener_connections{listener="peer"}`)+seen("peer")-before >= float64(n)
	})
	peak = max(peak, rssBytes(t, p.cmd.Process.Pid))
	if !healthy() {
		t.Fatalf("/healthz does not answer with %d idle connections", n)
	}
	if code, _ := send(t, "POST", p.http, "/v1/check", "application/json", `{"rule":"default","key":"k"}`); code != 200 {
		t.Fatalf("check during the idle flood: %d", code)
	}
	t.Logf("RSS %d MiB at rest, %d MiB at peak (growth %.1f MiB; limit 64)", base>>20, peak>>20, float64(peak-base)/(1<<20))
	if peak-base >= maxRSSGrowth {
		t.Fatalf("RSS grew by %d MiB (from %d to %d MiB), want < 64 MiB", (peak-base)>>20, base>>20, peak>>20)
	}
}

// certs refuses what would make a broken set — names that are paths, that
// collide with the CA's files or each other, a validity that would be
// born expired, files that exist — before it writes anything. Was: all
// accepted, "../x" wrote outside --dir, and a collision left half a set.
func TestCertsRefusesBadInputWritingNothing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "../escaped"}, `member name "../escaped"`},
		{[]string{"--nodes", "n1,ca"}, `member name "ca" is taken`},
		{[]string{"--nodes", "n1,n1"}, `"n1" given twice`},
		{[]string{"--nodes", "n1,n1-key"}, `collides with another's key file`},
		{[]string{"--nodes", ""}, "no member names"},
		{[]string{"--valid-for", "-1h"}, "--valid-for: at least 1h"},
		{[]string{"--valid-for", "0s"}, "--valid-for: at least 1h"},
	} {
		dir := filepath.Join(t.TempDir(), "c")
		var out, errs bytes.Buffer
		code := runCerts(append([]string{"--dir", dir}, tc.args...), func(string) string { return "" }, &out, &errs)
		entries, _ := os.ReadDir(dir)
		if code != 2 || !strings.Contains(errs.String(), tc.want) || len(entries) != 0 {
			t.Errorf("certs %q: exit %d, %q, %d files written; want exit 2 with %q and nothing written", tc.args, code, errs.String(), len(entries), tc.want)
		}
	}
	// An existing file of the set: refused before anything is written.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "n2.pem"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	code := runCerts([]string{"--dir", dir, "--nodes", "n1,n2"}, func(string) string { return "" }, &out, &errs)
	entries, _ := os.ReadDir(dir)
	if code != 2 || !strings.Contains(errs.String(), "n2.pem exists already") || len(entries) != 1 {
		t.Errorf("certs over an existing n2.pem: exit %d, %q, %d files; want exit 2 and only n2.pem", code, errs.String(), len(entries))
	}
}

// boltMeta is what these tests read of a bolt meta page.
type boltMeta struct{ txid, freelist, pgid uint64 }

// newestMeta reads the newer of db's two meta pages (bolt's layout: the
// meta follows a 16-byte page header; freelist at 32, pgid — the pages
// in use — at 40, txid at 48).
func newestMeta(db []byte) boltMeta {
	page := os.Getpagesize()
	read := func(i int) boltMeta {
		m := db[i*page+16:]
		return boltMeta{txid: binenc.LittleEndian.Uint64(m[48:]), freelist: binenc.LittleEndian.Uint64(m[32:]), pgid: binenc.LittleEndian.Uint64(m[40:])}
	}
	a, b := read(0), read(1)
	if b.txid > a.txid {
		return b
	}
	return a
}
