package gateway

import (
	"net/http/httptest"
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
			if r, err := matchRoute(routes, plain.Method, plain.URL, matchPath(plain.URL.Path), identify); r == nil || err != nil {
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
				if route, _, err := matchReadings(routes, r, identify); route == nil || err != nil {
					b.Fatal(route, err)
				}
			}
		})
	}
}
