package gateway

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/rules"
)

// BenchmarkMatchReadings is what matching a request to its route costs
// the gateway: a plain request (one reading) and one with a dot
// segment, ";" parameters and a method override (six readings), against
// the routes of README's example shape; "first reading" is the match of
// the resolved path alone, as before readings.
func BenchmarkMatchReadings(b *testing.B) {
	routes := []rules.Route{
		{Name: "health", Path: "/healthz", Unlimited: true},
		{Name: "static", Path: "/static/*", Unlimited: true},
		{Name: "login", Methods: []string{"POST"}, Path: "/login", Limits: []rules.Limit{{Rule: "lg", Cost: 1}}},
		{Name: "chat", Path: "/v1/chat/*", Limits: []rules.Limit{{Rule: "chat", Cost: 1}}},
		{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
	}
	identify := func() (string, error) { return "", nil }
	plain := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	odd := httptest.NewRequest("POST", "/v1/chat/../x;a=1/completions", nil)
	odd.Header.Set("X-HTTP-Method-Override", "GET")
	b.Run("first reading", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r, err := matchRoute(routes, plain.Method, plain.URL, matchPath(plain.URL.Path), false, identify); r == nil || err != nil {
				b.Fatal(r, err)
			}
		}
	})
	for _, tc := range []struct {
		name string
		req  any
	}{{"plain", plain}, {"six readings", odd}} {
		r := plain
		if tc.name != "plain" {
			r = odd
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if route, _, err := matchReadings(&routeSet{routes: routes}, r, identify); route == nil || err != nil {
					b.Fatal(route, err)
				}
			}
		})
	}
}

// BenchmarkMatchReadingsWorstCase is the most one request can make the
// gateway match: a path at the 8 KiB the gateway reads (maxPathBytes),
// of one long segment or of slashes, with a ";" parameter, an encoded
// ";" and a dot segment, and three override methods (up to 64 passes in
// all), against 1,000 routes: prefix routes ("/svcN/*"), routes with a
// "*" segment ("/svcN/items/*/detail"), or routes starting with one
// ("/*/svcN").
func BenchmarkMatchReadingsWorstCase(b *testing.B) {
	identify := func() (string, error) { return "", nil }
	for _, shape := range []string{"/svc%d/*", "/svc%d/items/*/detail", "/*/svc%d"} {
		var routes []rules.Route
		for i := range 999 {
			routes = append(routes, rules.Route{Name: fmt.Sprintf("r%d", i), Path: fmt.Sprintf(shape, i), Limits: []rules.Limit{{Rule: "x", Cost: 1}}})
		}
		routes = append(routes, rules.Route{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}})
		set := &routeSet{routes: routes}
		long := strings.Repeat("a", maxPathBytes-32)
		for _, tc := range []struct{ name, target, override string }{
			{"short plain", "/v1/chat/completions", ""},
			{"8 KiB plain", "/" + long, ""},
			{"8 KiB, every reading and method", "/" + long + ";x/%3Bq/./b", "A, B, C"},
			{"8 KiB of slashes, every reading and method", "/A;x/%3Bq/.." + strings.Repeat("/", maxPathBytes-32), "B, C, D"},
		} {
			r := httptest.NewRequest("POST", tc.target, nil)
			if tc.override != "" {
				r.Header.Set("X-HTTP-Method-Override", tc.override)
			}
			b.Run(fmt.Sprintf("%s/%s", strings.ReplaceAll(shape, "%d", "N"), tc.name), func(b *testing.B) {
				for b.Loop() {
					if route, _, err := matchReadings(set, r, identify); route == nil || err != nil {
						b.Fatal(route, err)
					}
				}
			})
		}
	}
}
