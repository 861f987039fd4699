package main

import (
	"slices"
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
