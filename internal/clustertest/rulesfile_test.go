package clustertest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/router"
)

// Every member given one rules file applies a change of it, mostly at
// the same instant: the rules are written once, in one version, not once
// per member (the leader does not write rules equal to those in force).
func TestSharedRulesFileWrittenOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write := func(limit string) {
		doc := "rules:\n  - {name: shared, algorithm: token_bucket, limit: " + limit + ", period: 1s}\n"
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10")
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		published := map[uint64]bool{} // every rules version a member's view had
		c := New(t, 3, Options{DataDirs: true, OnView: func(_ string, v *router.View) {
			mu.Lock()
			published[v.RulesVersion] = true
			mu.Unlock()
		}})
		for _, m := range c.Members() {
			go m.Node().WatchRulesFile(t.Context(), path, time.Second)
		}
		versions := func(limit int64) map[uint64]bool {
			seen := map[uint64]bool{}
			c.WaitFor("the file's rules everywhere", 10*time.Second, func() bool {
				clear(seen)
				for _, m := range c.Members() {
					v := m.Router().View()
					if v == nil || v.Rules["shared"] == nil || v.Rules["shared"].Limit != limit {
						return false
					}
					seen[v.RulesVersion] = true
				}
				return true
			})
			return seen
		}
		first := versions(10)
		time.Sleep(3 * time.Second) // every member has read the file again
		write("20")
		second := versions(20)
		time.Sleep(3 * time.Second)
		after := versions(20)
		if len(first) != 1 || len(second) != 1 || len(after) != 1 {
			t.Fatalf("rules versions: %v, then %v, then %v; want one each", first, second, after)
		}
		for v := range after {
			if !second[v] {
				t.Fatalf("the rules version moved from %v to %v with no change of the file", second, after)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(published) != 3 { // the built-in rules', and one per change of the file
			t.Fatalf("rules versions published: %v, want 3 (the initial one and one per change of the file)", published)
		}
	})
}
