package gateway

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

// FuzzMatchPath checks the two readings of a request path that routes
// are matched against (matchPath, withoutParams) on any path: the path
// without parameters holds no ";", is unchanged by a second cut and
// equals the path when it held none; the matched path is absolute and
// unchanged by a second resolution. A request target's other readings
// (otherReadings) are absolute paths, each once, none its matchPath.
func FuzzMatchPath(f *testing.F) {
	for _, p := range []string{"/login;jsessionid=1", "/static/..;/admin", "/a/b/../c/", "//x//y", `\admin\users`, ";", "/;/;;/", "", "/login;%2F..", "/a/%3B/..;/b", "/a/%2E%2E/b", "/index.php/login.json", "/A/x.PHP/b;c/./d.e"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		w := withoutParams(p)
		if strings.Contains(w, ";") {
			t.Fatalf("withoutParams(%q) = %q holds a ;", p, w)
		}
		if again := withoutParams(w); again != w {
			t.Fatalf("withoutParams(%q) = %q, then %q", p, w, again)
		}
		if !strings.Contains(p, ";") && w != p {
			t.Fatalf("withoutParams(%q) = %q: changed a path without parameters", p, w)
		}
		if u, err := url.ParseRequestURI(p); err == nil {
			first := matchPath(u.Path)
			rs := otherReadings(u, first, nil)
			if slices.Contains(rs, first) || len(slices.Compact(slices.Sorted(slices.Values(rs)))) != len(rs) {
				t.Fatalf("otherReadings(%q) = %q (first %q): first or a repeat", p, rs, first)
			}
			for _, r := range rs {
				if !strings.HasPrefix(r, "/") {
					t.Fatalf("otherReadings(%q) = %q: not absolute", p, rs)
				}
			}
		}
		for _, q := range []string{p, w} {
			m := matchPath(q)
			if !strings.HasPrefix(m, "/") {
				t.Fatalf("matchPath(%q) = %q: not absolute", q, m)
			}
			if again := matchPath(m); again != m {
				t.Fatalf("matchPath(%q) = %q, then %q", q, m, again)
			}
		}
	})
}
