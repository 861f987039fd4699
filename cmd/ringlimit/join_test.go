package main

import (
	"slices"
	"strings"
	"testing"
)

// A --join list makes the member it names first the seed; the member's
// own address is never one to join through.
func TestJoinList(t *testing.T) {
	for _, c := range []struct {
		join, adv string
		others    []string
		seed      bool
	}{
		{"", "n1:8080", nil, false},
		{"n1:8080", "n1:8080", nil, true}, // alone: bootstraps at once, as before lists
		{"n1:8080", "n2:8080", []string{"n1:8080"}, false},
		{"n1:8080,n2:8080,n3:8080", "n1:8080", []string{"n2:8080", "n3:8080"}, true},
		{"n1:8080,n2:8080,n3:8080", "n2:8080", []string{"n1:8080", "n3:8080"}, false},
		{" http://N1.:8080/ , n2:8080,,", "n1:8080", []string{"n2:8080"}, true},
		{",n1:8080,n2:8080", "n1:8080", []string{"n2:8080"}, true},
		{"n2:8080,n1:8080", "n1:8080", []string{"n2:8080"}, false},
	} {
		others, seed := joinList(c.join, c.adv)
		if !slices.Equal(others, c.others) || seed != c.seed {
			t.Errorf("joinList(%q, %q) = %q, %v, want %q, %v", c.join, c.adv, others, seed, c.others, c.seed)
		}
	}
}

// Every --join address is checked before serve starts; a fully qualified
// name's trailing dot is one (isSelf reads it), not an error.
func TestCheckJoin(t *testing.T) {
	for _, c := range []struct {
		join, err string
	}{
		{"", ""},
		{" http://N1.:8080/ , n2:8080,,", ""},
		{"ringlimit-0.ringlimit-peers.ns.svc.cluster.local.:8080", ""},
		{"::::", "want host:port"},
		{"127.0.0.1:8080,n2:99999", `--join "n2:99999": port must be 1 to 65535`},
		{"n1..:8080", "not a host name or IP address"},
		{"0.0.0.0:8080", "an unspecified address"},
	} {
		err := checkJoin(c.join)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("checkJoin(%q) = %v, want %q", c.join, err, c.err)
		}
	}
}
