package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunDispatch(t *testing.T) {
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		exit int
		out  string // expected in stdout+stderr
	}{
		{nil, 2, "usage:"},
		{[]string{"help"}, 0, "ringlimit serve"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"serve", "-h"}, 0, "-data-dir"},
		{[]string{"serve", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"serve", "stray"}, 2, `unexpected argument "stray"`},
		{[]string{"serve", "--log-level", "loud"}, 2, "--log-level"},
		{[]string{"serve", "--envoy-config", "x.yaml"}, 2, "--envoy-config needs --grpc"},
		{[]string{"serve", "--grpc", "127.0.0.1:0", "--envoy-config", "/nonexistent/ratelimit.yaml"}, 2, "envoy config refused"},
		{[]string{"router", "--cluster", "127.0.0.1:1", "--envoy-config", "x.yaml"}, 2, "--envoy-config needs --grpc"},
		// Durations and counts that cannot work are refused, not taken as
		// a default or as "none" (was: every SIGTERM after
		// --drain-timeout -1s exited 1 without a drain, --max-keys -5
		// meant no cap, --refresh -1s meant 1s).
		{[]string{"serve", "--drain-timeout", "-1s"}, 2, "--drain-timeout: must be > 0, got -1s"},
		{[]string{"serve", "--drain-timeout", "0s"}, 2, "--drain-timeout: must be > 0"},
		{[]string{"serve", "--dead-after", "-1s"}, 2, "--dead-after: must be > 0"},
		{[]string{"serve", "--max-keys", "-5"}, 2, "--max-keys: must be ≥ 0 (0: no cap), got -5"},
		// Values refused again inside server.Start exited 1, as a start
		// that failed on good flags does; they are usage errors (2).
		{[]string{"serve", "--dead-after", "100ms"}, 2, "--dead-after: must be ≥ --raft-timeout (1s)"},
		{[]string{"serve", "--raft-timeout", "6s"}, 2, "--dead-after: must be ≥ --raft-timeout (6s)"},
		{[]string{"serve", "--raft-timeout", "10ms"}, 2, "--raft-timeout: must be ≥ 100ms, got 10ms"},
		{[]string{"serve", "--linger", "2s"}, 2, "router: linger 2s outside [0, 1s]"},
		{[]string{"serve", "--max-batch", "100000"}, 2, "router: max batch 100000"},
		{[]string{"serve", "--forward-timeout", "-1s"}, 2, "router: negative timeout"},
		{[]string{"serve", "--id", ""}, 2, "--id: must not be empty"},
		{[]string{"serve", "--advertise-host", "bad host!"}, 2, "not a host name or IP address"},
		{[]string{"serve", "--advertise-host", "0.0.0.0"}, 2, "an unspecified address (0.0.0.0, ::) cannot be reached"},
		{[]string{"serve", "--join", "::::"}, 2, "want host:port"},
		{[]string{"serve", "--join", "127.0.0.1:8080,n2:99999"}, 2, "port must be 1 to 65535"},
		{[]string{"serve", "--data-dir", ""}, 2, "--data-dir: must not be empty"},
		{[]string{"serve", "--admin-token", "tok "}, 2, "--admin-token: contains white space"},
		{[]string{"serve", "--admin-token", "tok\n"}, 2, "--admin-token: contains white space"},
		{[]string{"serve", "--view-token", "v\t"}, 2, "--view-token: contains white space"},
		{[]string{"serve", "--admin-token", "same", "--view-token", "same"}, 2, "--view-token: the same as --admin-token"},
		{[]string{"router", "--cluster", "127.0.0.1:1", "--admin-token", "a b", "--http", "127.0.0.1:0"}, 2, "--admin-token: contains white space"},
		{[]string{"router", "--cluster", "127.0.0.1:1", "--refresh", "-1s", "--http", "127.0.0.1:0"}, 2, "--refresh: must be > 0, got -1s"},
		{[]string{"gateway", "--cluster", "127.0.0.1:1", "--upstream", "http://127.0.0.1:1", "--refresh", "0s", "--listen", "127.0.0.1:0"}, 2, "--refresh: must be > 0, got 0s"},
		{[]string{"router", "--cluster", "127.0.0.1:1", "--drain-timeout", "0s", "--http", "127.0.0.1:0"}, 2, "--drain-timeout: must be > 0, got 0s"},
		{[]string{"gateway", "--cluster", "127.0.0.1:1", "--upstream", "http://127.0.0.1:1", "--drain-timeout", "-1s", "--listen", "127.0.0.1:0"}, 2, "--drain-timeout: must be > 0, got -1s"},
	} {
		var stdout, stderr bytes.Buffer
		exit := run(context.Background(), tc.args, noenv, &stdout, &stderr)
		if all := stdout.String() + stderr.String(); exit != tc.exit || !strings.Contains(all, tc.out) {
			t.Errorf("ringlimit %q: exit %d, output %q; want exit %d with %q", tc.args, exit, all, tc.exit, tc.out)
		}
	}
}

// bench dials and listens on nothing: its security flags' help names no
// flag it lacks (--insecure once spoke of --raft/--peer).
func TestBenchHelpNamesItsOwnFlags(t *testing.T) {
	var out bytes.Buffer
	if exit := run(context.Background(), []string{"bench", "-h"}, func(string) string { return "" }, &out, &out); exit != 0 {
		t.Fatalf("bench -h: exit %d: %s", exit, out.String())
	}
	for _, f := range []string{"--raft", "--peer ", "--peer/", "member's"} {
		if strings.Contains(out.String(), f) {
			t.Errorf("bench -h mentions %q:\n%s", f, out.String())
		}
	}
}

func TestAdvertise(t *testing.T) {
	for _, tc := range []struct{ listen, host, want, err string }{
		{"127.0.0.1:8080", "", "127.0.0.1:8080", ""},
		{"0.0.0.0:8080", "10.0.0.5", "10.0.0.5:8080", ""},
		{"0.0.0.0:8080", "", "", "--advertise-host"},
		{"[::]:8080", "", "", "--advertise-host"},
	} {
		got, err := advertise(tc.listen, tc.host)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("advertise(%q, %q) = %q, %v; want %q, %q", tc.listen, tc.host, got, err, tc.want, tc.err)
		}
	}
}

func TestIsSelf(t *testing.T) {
	for _, c := range []struct {
		join, adv string
		want      bool
	}{
		{"", "n1:8080", false},
		{"n1:8080", "n1:8080", true},
		{"http://N1.peers.ns.svc.:8080/", "n1.peers.ns.svc:8080", true},
		{"n1:8080", "n1:8090", false},
		{"n2:8080", "n1:8080", false},
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{"localhost:8080", "127.0.0.1:8080", true},
		{"LOCALHOST.:8080", "127.0.0.1:8080", true},
		{"localhost:8080", "[::1]:8080", false}, // else a member on 127.0.0.1 and one on ::1 both seed
		{"[::1]:8080", "localhost:8080", false},
		{"127.0.0.1:8080", "localhost:8080", true},
		{"localhost:8080", "127.0.0.2:8080", false},
		{"localhost:8090", "127.0.0.1:8080", false},
		{"127.0.0.1:8080", "[::1]:8080", false},
	} {
		if got := isSelf(c.join, c.adv); got != c.want {
			t.Errorf("isSelf(%q, %q) = %v, want %v", c.join, c.adv, got, c.want)
		}
	}
}
