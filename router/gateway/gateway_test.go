package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/logbuf"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/router"
	"github.com/ringlimit/ringlimit/rules"
)

// tableChecker decides with a real limiter.Table on the caller's clock
// (fake inside a synctest bubble), validating a call whole first as the
// router does. It records the keys it was asked about.
type tableChecker struct {
	view *router.View
	tab  *limiter.Table
	now  int64 // the checks' clock, which stands still: budgets never refill between two checks of a test

	mu    sync.Mutex // guards calls
	calls [][]router.Request
}

func newChecker(t *testing.T, rs ...limiter.Rule) *tableChecker {
	t.Helper()
	byName := map[string]*limiter.Rule{}
	for _, r := range append(rs, rules.Default()) {
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		byName[r.Name] = &r
	}
	tab, err := limiter.NewTable(1)
	if err != nil {
		t.Fatal(err)
	}
	return &tableChecker{view: &router.View{Seed: 1, Rules: byName}, tab: tab, now: time.Now().UnixNano()}
}

func (c *tableChecker) View() *router.View { return c.view }

func (c *tableChecker) Check(_ context.Context, reqs []router.Request, out []router.Result) error {
	for i, q := range reqs {
		r := c.view.Rules[q.Rule]
		if r == nil {
			return &router.ItemError{Index: i, Err: fmt.Errorf("%w %q", router.ErrUnknownRule, q.Rule)}
		}
		if err := r.CheckCost(q.Cost); err != nil {
			return &router.ItemError{Index: i, Err: err}
		}
	}
	c.mu.Lock()
	c.calls = append(c.calls, append([]router.Request(nil), reqs...))
	c.mu.Unlock()
	for i := 0; i < len(reqs); { // each group (Joined) all-or-nothing
		end := i + 1
		for end < len(reqs) && reqs[end].Joined {
			end++
		}
		items := make([]limiter.Item, 0, end-i)
		for _, q := range reqs[i:end] {
			r := c.view.Rules[q.Rule]
			b := limiter.BucketHash(limiter.KeyHash(1, q.Key), limiter.RuleSalt(1, r.Name, r.Algorithm))
			items = append(items, limiter.Item{Bucket: b, Rule: r, Cost: q.Cost})
		}
		ds := make([]limiter.Decision, len(items))
		if _, err := c.tab.CheckGroup(items, c.now, ds); err != nil {
			return err
		}
		for k, d := range ds {
			out[i+k] = router.Result{Decision: d}
		}
		i = end
	}
	return nil
}

// remaining queries (cost 0) what key has left of rule.
func (c *tableChecker) remaining(t *testing.T, rule, key string) int64 {
	t.Helper()
	out := make([]router.Result, 1)
	if err := c.Check(context.Background(), []router.Request{{Rule: rule, Key: key}}, out); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.calls = c.calls[:len(c.calls)-1]
	c.mu.Unlock()
	return out[0].Remaining
}

func (c *tableChecker) keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ks []string
	for _, call := range c.calls {
		for _, q := range call {
			ks = append(ks, q.Key)
		}
	}
	return ks
}

// upstream is an httptest server counting the requests it got.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

// slowUpstream is an upstream that never sends its response headers:
// it counts each request and holds it until the client leaves or the
// test ends.
func slowUpstream(t *testing.T) *upstream {
	release := make(chan struct{})
	slow := &upstream{}
	slow.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slow.hits.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) }) // runs first: Close waits for the handlers
	return slow
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.WriteString(w, "upstream "+r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

// front starts the gateway as an httptest server in front of up.
func front(t *testing.T, up *upstream, c Checker, cfg Config) *httptest.Server {
	t.Helper()
	u, _ := url.Parse(up.URL)
	cfg.Upstream = u
	g, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(g)
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	return request(t, http.MethodGet, url, hdr)
}

// request sends method to url with the headers hdr and reads the answer
// to its end.
func request(t *testing.T, method, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// requestHeader is request with h as the headers, repeated ones too,
// and the answer's body.
func requestHeader(t *testing.T, method, url string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// keys of the three kinds, made at test time.
type testKeys struct {
	hsSecret []byte
	rsa      *rsa.PrivateKey
	ec       *ecdsa.PrivateKey
}

func makeKeys(t *testing.T) testKeys {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKeys{hsSecret: []byte(rand.Text() + rand.Text()), rsa: rk, ec: ek}
}

func pemOf(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func sign(t *testing.T, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Valid tokens of every key kind key the client by its claim and tier;
// forged, expired, not-yet-valid, alg none and wrong-key tokens are
// refused 401 and spend nothing of the tenant they name.
func TestJWTIdentityAndRefusedTokensSpendNothing(t *testing.T) {
	ks := makeKeys(t)
	other := makeKeys(t)
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: ks.rsa.Public(), KeyID: "r1", Algorithm: "RS256", Use: "sig"},
		{Key: ks.ec.Public(), KeyID: "e1", Algorithm: "ES256", Use: "sig"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := jwt.MapClaims{"sub": "tenant-a", "plan": "pro", "exp": now.Add(time.Hour).Unix()}
	expired := jwt.MapClaims{"sub": "tenant-a", "exp": now.Add(-time.Minute).Unix()}
	early := jwt.MapClaims{"sub": "tenant-a", "nbf": now.Add(time.Hour).Unix()}
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", good)

	for _, tc := range []struct {
		name  string
		key   []byte
		valid string
		bad   map[string]string
	}{
		{"HS256", append(ks.hsSecret, '\n'), sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", good), map[string]string{
			"forged":  sign(t, jwt.SigningMethodHS256, other.hsSecret, "", good),
			"expired": sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", expired),
			"nbf":     sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", early),
			"none":    none,
			"garbage": "a.b.c",
		}},
		{"RS256", pemOf(t, ks.rsa.Public()), sign(t, jwt.SigningMethodRS256, ks.rsa, "", good), map[string]string{
			"wrong key": sign(t, jwt.SigningMethodRS256, other.rsa, "", good),
			"expired":   sign(t, jwt.SigningMethodRS256, ks.rsa, "", expired),
			"none":      none,
			// The classic confusion: HMAC keyed with the public key's PEM.
			"hs256 with the public key": sign(t, jwt.SigningMethodHS256, pemOf(t, ks.rsa.Public()), "", good),
		}},
		{"ES256", pemOf(t, ks.ec.Public()), sign(t, jwt.SigningMethodES256, ks.ec, "", good), map[string]string{
			"wrong key": sign(t, jwt.SigningMethodES256, other.ec, "", good),
			"expired":   sign(t, jwt.SigningMethodES256, ks.ec, "", expired),
			"none":      none,
		}},
		{"JWKS", jwks, sign(t, jwt.SigningMethodES256, ks.ec, "e1", good), map[string]string{
			"rsa kid":       sign(t, jwt.SigningMethodRS256, ks.rsa, "r1", good), // valid too: checked below
			"wrong key":     sign(t, jwt.SigningMethodRS256, other.rsa, "r1", good),
			"unknown kid":   sign(t, jwt.SigningMethodES256, ks.ec, "nope", good),
			"kid of rsa":    sign(t, jwt.SigningMethodES256, ks.ec, "r1", good),
			"expired":       sign(t, jwt.SigningMethodES256, ks.ec, "e1", expired),
			"none":          none,
			"forged hs256":  sign(t, jwt.SigningMethodHS256, ks.hsSecret, "e1", good),
			"tampered body": tamper(sign(t, jwt.SigningMethodES256, ks.ec, "e1", good)),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := ParseJWTKeys(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			c := newChecker(t)
			up := newUpstream(t)
			s := front(t, up, c, Config{Identity: Identity{JWT: keys, TierClaim: "plan"}, Routes: []rules.Route{
				{Name: "pro", Path: "/*", Tier: "pro", Limits: []rules.Limit{{Rule: "default", Cost: 1}}},
			}})
			for name, tok := range tc.bad {
				if name == "rsa kid" {
					continue
				}
				resp := get(t, s.URL+"/x", map[string]string{"Authorization": "Bearer " + tok})
				if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("%s token: status %d, want 401 with WWW-Authenticate", name, resp.StatusCode)
				}
			}
			if n := len(c.keys()); n != 0 || up.hits.Load() != 0 {
				t.Fatalf("refused tokens reached the limiter %d times and the upstream %d times; want 0 and 0", n, up.hits.Load())
			}
			if got := c.remaining(t, "default", "sub:tenant-a"); got != 200 {
				t.Fatalf("tenant-a has %d left after refused tokens, want all 200", got)
			}
			valid := []string{tc.valid}
			if tok, ok := tc.bad["rsa kid"]; ok {
				valid = append(valid, tok)
			}
			for _, tok := range valid {
				resp := get(t, s.URL+"/x", map[string]string{"Authorization": "Bearer " + tok})
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("valid token: status %d", resp.StatusCode)
				}
			}
			if got := c.keys(); len(got) != len(valid) || got[0] != "sub:tenant-a" {
				t.Fatalf("limiter keys %v, want sub:tenant-a (tier pro matched the route)", got)
			}
			if got := c.remaining(t, "default", "sub:tenant-a"); got != 200-int64(len(valid)) {
				t.Fatalf("tenant-a has %d left, want %d", got, 200-len(valid))
			}
		})
	}
}

func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	claims, _ := json.Marshal(jwt.MapClaims{"sub": "tenant-a", "admin": true})
	parts[1] = strings.TrimRight(base64URL(claims), "=")
	return strings.Join(parts, ".")
}

func base64URL(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func TestParseJWTKeysRefusesWeakAndPrivate(t *testing.T) {
	if _, err := ParseJWTKeys([]byte("short\n")); err == nil {
		t.Error("a 5-byte HS256 secret was accepted")
	}
	if _, err := ParseJWTKeys([]byte(`{"keys": []}`)); err == nil {
		t.Error("an empty JWKS was accepted")
	}
	ks := makeKeys(t)
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: ks.ec, KeyID: "p"}}})
	if _, err := ParseJWTKeys(priv); err == nil {
		t.Error("a JWKS with a private key was accepted")
	}
}

// What the upstream is told of a request's origin is what the gateway
// knows: from an untrusted peer, the forwarding headers it wrote are
// dropped (X-Forwarded-For starts at the peer; X-Forwarded-Host and
// -Proto are the gateway's), and so is a header spelled with
// underscores for the API-key header (an upstream
// behind CGI, WSGI or Rack reads X_Api_Key as X-Api-Key); from a trusted
// proxy they are kept, X-Forwarded-For appended to. Was: passed as the
// client wrote them, and no X-Forwarded-Host or -Proto of the gateway's.
func TestForwardingHeadersSayWhatTheGatewayKnows(t *testing.T) {
	loop, _ := ParseCIDRs("127.0.0.0/8, ::1")
	got := make(chan http.Header, 1)
	up := &upstream{}
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
	}))
	t.Cleanup(up.Close)
	sent := map[string]string{
		"X-Forwarded-For":   "203.0.113.7",
		"X-Forwarded-Host":  "evil.example",
		"X-Forwarded-Proto": "https",
		"Forwarded":         "for=203.0.113.7;proto=https;host=evil.example",
		"X-Real-Ip":         "203.0.113.7",
		"X_Api_Key":         "smuggled",
		"X_Forwarded_Host":  "evil.example",
		"X_Real_Ip":         "203.0.113.7",
		"X-Other_Header":    "kept",
	}
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		want    map[string]string // "" = absent
	}{
		{"untrusted peer", nil, map[string]string{
			"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "Forwarded": "", "X-Real-Ip": "",
			"X_api_key": "", "X_forwarded_host": "", "X_real_ip": "", "X-Other_header": "kept",
		}},
		{"trusted proxy", loop, map[string]string{
			"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https",
			"Forwarded": "for=203.0.113.7;proto=https;host=evil.example", "X-Real-Ip": "203.0.113.7",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(t)
			s := front(t, up, c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key", TrustedProxies: tc.trusted}})
			hdr := maps.Clone(sent)
			if tc.trusted == nil {
				// Not a way to take the gateway's own forwarding
				// headers out either.
				hdr["Connection"] = "X-Forwarded-Host, X-Forwarded-Proto"
			}
			if resp := get(t, s.URL, hdr); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			h := <-got
			want := tc.want
			if tc.trusted == nil {
				want["X-Forwarded-Host"] = strings.TrimPrefix(s.URL, "http://")
			}
			for k, v := range want {
				if g := strings.Join(h.Values(k), ", "); g != v {
					t.Errorf("upstream got %s %q, want %q", k, g, v)
				}
			}
		})
	}
}

// Behind a trusted proxy the client is keyed by its real address; behind
// an untrusted one by the proxy's, whatever X-Forwarded-For claims.
func TestClientIPFromTrustedProxiesOnly(t *testing.T) {
	loop, _ := ParseCIDRs("127.0.0.0/8, ::1")
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		xff     string
		want    string
	}{
		{"untrusted proxy", nil, "203.0.113.7", "ip:127.0.0.1"},
		{"trusted proxy", loop, "203.0.113.7", "ip:203.0.113.7"},
		{"client-written hop left of the real one", loop, "198.51.100.1, 203.0.113.7", "ip:203.0.113.7"},
		{"chain of trusted proxies", loop, "203.0.113.7, 127.0.0.5", "ip:203.0.113.7"},
		{"no header", loop, "", "ip:127.0.0.1"},
		{"garbage", loop, "not-an-ip", "ip:127.0.0.1"},
		// Was: garbage (keyed by the proxy, all clients one budget).
		{"ipv4 with port", loop, "203.0.113.7:80", "ip:203.0.113.7"},
		// IPv6: keyed by the /64 (TestIPv6ClientsAreKeyedByTheirNetwork).
		{"ipv6 with port", loop, "[2001:db8::1]:443", "ip:2001:db8::/64"},
		{"bracketed ipv6", loop, "[2001:db8::1]", "ip:2001:db8::/64"},
		{"trusted hop with port", loop, "203.0.113.7, 127.0.0.5:8080", "ip:203.0.113.7"},
		// Was: the zone kept, one budget per zone name the client writes.
		{"ipv6 zone", loop, "2001:db8::1%eth0", "ip:2001:db8::/64"},
		{"ipv6 zone with port", loop, "[fe80::1%25eth0]:443", "ip:fe80::/64"},
		{"mapped with port", loop, "[::ffff:203.0.113.7]:80", "ip:203.0.113.7"},
		{"port alone", loop, ":80", "ip:127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(t)
			s := front(t, newUpstream(t), c, Config{Identity: Identity{TrustedProxies: tc.trusted}})
			hdr := map[string]string{}
			if tc.xff != "" {
				hdr["X-Forwarded-For"] = tc.xff
			}
			if resp := get(t, s.URL, hdr); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := c.keys(); len(got) != 1 || got[0] != tc.want {
				t.Fatalf("keyed as %v, want %s", got, tc.want)
			}
		})
	}
}

// Go's ServeMux resolves dot segments in the path as sent: "%2E%2E" is a
// name to it, and "/api/%2E%2E/static/x" is served by "/api/". The
// gateway charges it under "/api/*" as well as exempting nothing. Was:
// decoded and resolved to "/static/x", exempt.
func TestEncodedDotSegmentsAreChargedAsServeMuxServesThem(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "api") })
	mux.HandleFunc("/static/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "static") })
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	c := newChecker(t, limiter.Rule{Name: "api", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	g, err := New(Config{Upstream: u, Routes: []rules.Route{
		{Name: "static", Path: "/static/*", Unlimited: true},
		{Name: "api", Path: "/api/*", Limits: []rules.Limit{{Rule: "api", Cost: 1}}},
	}}, c)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(g)
	t.Cleanup(s.Close)
	served := 0
	for range 3 {
		status, _ := rawGet(t, s.Listener.Addr().String(), "/api/%2E%2E/static/x")
		if status == http.StatusOK {
			served++
		}
	}
	if served != 1 {
		t.Errorf("/api/%%2E%%2E/static/x, served by ServeMux's /api/: %d of 3 passed a limit of 1", served)
	}
}

// A request that names another method in an override header or a
// _method query parameter (Rails, Symfony, Laravel, Slim, Express's
// method-override serve it as that method) is charged under that
// method's routes too; one naming more than 3 methods is refused (400).
// Was: a POST with "X-HTTP-Method-Override: GET" went past a GET route's
// limit; then junk named first, an encoded or PHP-mangled _method key,
// an underscore-spelled header, "post" and a GET naming POST did (two
// helpers attacking the gateway).
func TestMethodOverrideIsChargedAsTheMethodItNames(t *testing.T) {
	for _, tc := range []struct {
		method, target, route string
		header                []string
		want                  int
	}{
		{"POST", "/search", "GET", []string{"X-HTTP-Method-Override: GET"}, http.StatusTooManyRequests},
		{"POST", "/search", "GET", []string{"X-Http-Method: get"}, http.StatusTooManyRequests},
		{"POST", "/search", "GET", []string{"X-Method-Override: PATCH, GET"}, http.StatusTooManyRequests},
		{"POST", "/search?_method=get", "GET", nil, http.StatusTooManyRequests},
		{"POST", "/search?%5Fmethod=GET", "GET", nil, http.StatusTooManyRequests},
		{"POST", "/search?.method=GET", "GET", nil, http.StatusTooManyRequests},
		{"POST", "/search?+method=GET", "GET", nil, http.StatusTooManyRequests},
		{"POST", "/search", "GET", []string{"X_HTTP_Method_Override: GET"}, http.StatusTooManyRequests},
		{"post", "/search", "GET", []string{"X-HTTP-Method-Override: GET"}, http.StatusTooManyRequests},
		{"GET", "/search", "POST", []string{"X-Http-Method-Override: POST"}, http.StatusTooManyRequests},
		{"PUT", "/search", "POST", []string{"X-Http-Method-Override: POST"}, http.StatusTooManyRequests},
		{"POST", "/search?_method=A&_method=B&_method=C&_method=GET", "GET", nil, http.StatusBadRequest},
		{"POST", "/search?_method=GET", "GET", []string{"X-Method-Override: A, B, C"}, http.StatusBadRequest},
		{"POST", "/search", "GET", []string{"X-Method-Override: A, B, GET"}, http.StatusTooManyRequests},
	} {
		c := newChecker(t, limiter.Rule{Name: "search", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
		s := front(t, newUpstream(t), c, Config{Routes: []rules.Route{
			{Name: "search", Methods: []string{tc.route}, Path: "/search", Limits: []rules.Limit{{Rule: "search", Cost: 1}}},
		}})
		addr := s.Listener.Addr().String()
		if status := rawDo(t, addr, tc.route, "/search"); status != http.StatusOK {
			t.Fatalf("%s /search: %d", tc.route, status)
		}
		if status := rawDo(t, addr, tc.method, tc.target, tc.header...); status != tc.want {
			t.Errorf("%s %s %q after %s /search: %d, want %d", tc.method, tc.target, tc.header, tc.route, status, tc.want)
		}
	}
}

// An exemption that names a path exactly ("/robots.txt") keeps it
// exempt: its reading without the extension is not made, and the client
// is not identified (an expired token passes, as README says of an
// unlimited route before the tier routes). Was: "/robots" fell to the
// catch-all, and "/robots.txt" was limited, an expired token 401 (a
// helper reviewing the change).
func TestAnExemptionNamingAPathKeepsIt(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t, limiter.Rule{Name: "all", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{
		Identity: Identity{JWT: mustJWT(t, ks.hsSecret), TierClaim: "plan"},
		Routes: []rules.Route{
			{Name: "robots", Path: "/robots.txt", Unlimited: true},
			{Name: "pro", Path: "/*", Tier: "pro", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
		}})
	expired := "Bearer " + sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", jwt.MapClaims{"sub": "a", "exp": time.Now().Add(-time.Hour).Unix()})
	for i := range 3 {
		if status := get(t, s.URL+"/robots.txt", map[string]string{"Authorization": expired}).StatusCode; status != http.StatusOK {
			t.Fatalf("GET /robots.txt #%d with an expired token: %d, want 200 (exempt)", i, status)
		}
	}
}

// An exemption named exactly by the first reading ("/") does not keep
// the other readings from being read without their extension:
// "/login.json//.." is "/login.json/" to an upstream that resolves as
// RFC 3986 says, "/login" to Rails. Was: not read so, exempt.
func TestAnExactExemptionOfOneReadingLeavesTheOthers(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "lg", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour},
		limiter.Rule{Name: "all", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{Routes: []rules.Route{
		{Name: "root", Path: "/", Unlimited: true},
		{Name: "login", Path: "/login", Limits: []rules.Limit{{Rule: "lg", Cost: 1}}},
		{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
	}})
	addr := s.Listener.Addr().String()
	rawDo(t, addr, "GET", "/login.json//..")
	if status := rawDo(t, addr, "GET", "/login"); status != http.StatusTooManyRequests {
		t.Errorf("GET /login after GET /login.json//..: %d, want 429 (charged under /login)", status)
	}
}

// A path past 8 KiB, decoded or as sent, is refused (414): each reading
// of it is a pass over the routes. Was: up to 64 KiB, and a path of
// 60,000 slashes took a second to match (a helper attacking the
// gateway).
func TestALongPathIsRefused(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "all", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{Routes: []rules.Route{{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}}}})
	addr := s.Listener.Addr().String()
	for target, want := range map[string]int{
		"/" + strings.Repeat("a", maxPathBytes-1):     http.StatusOK,
		"/" + strings.Repeat("a", maxPathBytes):       http.StatusRequestURITooLong,
		"/" + strings.Repeat("%61", maxPathBytes/3+1): http.StatusRequestURITooLong,
	} {
		if status := rawDo(t, addr, "GET", target); status != want {
			t.Errorf("a path of %d bytes as sent: %d, want %d", len(target), status, want)
		}
	}
}

// A route pattern with a capital letter ("/Account/Login", as ASP.NET
// apps are written) is matched case-insensitively too, as those
// upstreams route: "/account/login" is charged under it. Was: only a
// request with a capital letter was (a helper reviewing the change).
func TestAPatternWithACapitalMatchesAnyCase(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "lg", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{Routes: []rules.Route{
		{Name: "login", Path: "/Account/Login", Limits: []rules.Limit{{Rule: "lg", Cost: 1}}},
	}})
	addr := s.Listener.Addr().String()
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests, http.StatusTooManyRequests} {
		if status := rawDo(t, addr, "POST", "/account/login"); status != want {
			t.Errorf("POST /account/login #%d: %d, want %d", i, status, want)
		}
	}
}

// A request that can be read in more than maxPasses ways is refused
// (400): matching it would cost the gateway that many passes over its
// routes. One with a few is matched in each.
func TestTooManyReadingsAreRefused(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "api", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{Routes: []rules.Route{{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "api", Cost: 1}}}}})
	addr := s.Listener.Addr().String()
	if status := rawDo(t, addr, "POST", "/A/x.php/b;c/./d.e;f/../g.h", "X-Method-Override: P, Q, R"); status != http.StatusBadRequest {
		t.Errorf("a path of many readings with 3 override methods: %d, want 400", status)
	}
	if status := rawDo(t, addr, "POST", "/index.php/Login.json;jsessionid=1", "X-HTTP-Method-Override: GET"); status != http.StatusOK {
		t.Errorf("a path of a few readings with an override: %d, want 200", status)
	}
}

// Two routes of two readings of one request that name one rule (at two
// costs, or keyed by the client and by the IP of a client known by its
// IP alone) charge it once, at the higher cost. Was: the group named
// the rule and key twice, which the router refuses: a request with a
// jsessionid was refused (a helper attacking the gateway).
func TestOneRuleOfTwoReadingsIsChargedOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes []rules.Route
		spent  int64 // of 100, after one request
	}{
		{"costs differ", []rules.Route{
			{Name: "upload", Path: "/upload", Limits: []rules.Limit{{Rule: "api", Cost: 5}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "api", Cost: 1}}},
		}, 5},
		{"key client spelled out", []rules.Route{
			{Name: "upload", Path: "/upload", Limits: []rules.Limit{{Rule: "api", Cost: 1, Key: rules.KeyClient}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "api", Cost: 1}}},
		}, 1},
		{"ip and client, anonymous", []rules.Route{
			{Name: "upload", Path: "/upload", Limits: []rules.Limit{{Rule: "api", Cost: 1, Key: rules.KeyIP}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "api", Cost: 1}}},
		}, 1},
	} {
		for _, target := range []string{"/upload;jsessionid=ABC", "/upload/x/.."} {
			c := newChecker(t, limiter.Rule{Name: "api", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Hour})
			s := front(t, newUpstream(t), c, Config{Routes: tc.routes})
			if status := rawDo(t, s.Listener.Addr().String(), "GET", target); status != http.StatusOK {
				t.Errorf("%s: GET %s: %d, want 200", tc.name, target, status)
			}
			if got := c.remaining(t, "api", "ip:127.0.0.1"); got != 100-tc.spent {
				t.Errorf("%s: GET %s left %d of 100, want %d", tc.name, target, got, 100-tc.spent)
			}
		}
	}
}

// An IPv6 client is keyed by its /64 (or the prefix set): its hosts pick
// their addresses in it at will. Was: by the whole address, and a client
// that changed address per request passed a limit of 1 per IP 5 times of
// 5 (a helper attacking the gateway).
func TestIPv6ClientsAreKeyedByTheirNetwork(t *testing.T) {
	for _, tc := range []struct {
		bits    int
		allowed int // of 5 requests from 5 addresses of one /64, the first /56's
		key     string
	}{
		{0, 1, "ip:2001:db8:1:2::/64"},
		{56, 1, "ip:2001:db8:1::/56"},
		{128, 5, "ip:2001:db8:1:2::1"},
	} {
		c := newChecker(t, limiter.Rule{Name: "login-per-ip", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
		g, err := New(Config{Identity: Identity{IPv6Prefix: tc.bits},
			Routes: []rules.Route{{Name: "login", Path: "/login", Limits: []rules.Limit{{Rule: "login-per-ip", Cost: 1, Key: rules.KeyIP}}}},
			Next:   http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}, c)
		if err != nil {
			t.Fatal(err)
		}
		allowed := 0
		for i := range 5 {
			r := httptest.NewRequest(http.MethodPost, "/login", nil)
			r.RemoteAddr = fmt.Sprintf("[2001:db8:1:2::%x]:5555", i+1)
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code == http.StatusOK {
				allowed++
			}
		}
		if keys := c.keys(); allowed != tc.allowed || keys[0] != tc.key {
			t.Errorf("prefix /%d: %d of 5 allowed, keyed %v; want %d, keyed %s", tc.bits, allowed, keys, tc.allowed, tc.key)
		}
	}
}

// An IPv6 address that stands for an IPv4 one (NAT64's 64:ff9b::/96,
// 6to4's 2002::/16) is keyed by that IPv4 address. Was: by its /64, so
// behind a NAT64 every IPv4 client shared one budget, and one 6to4 host
// had 65,536 (a helper attacking the gateway).
func TestIPv6AddressesOfIPv4ClientsAreKeyedByTheirIPv4(t *testing.T) {
	trusted, _ := ParseCIDRs("127.0.0.0/8")
	for _, tc := range []struct{ xff, key string }{
		{"64:ff9b::203.0.113.7", "ip:203.0.113.7"},
		{"64:ff9b::198.51.100.9", "ip:198.51.100.9"},
		{"2002:cb00:7107:1::1", "ip:203.0.113.7"},
		{"2002:cb00:7107:2::1", "ip:203.0.113.7"},
		{"2001:db8:1:2::1", "ip:2001:db8:1:2::/64"},
	} {
		c := newChecker(t)
		s := front(t, newUpstream(t), c, Config{Identity: Identity{TrustedProxies: trusted}})
		get(t, s.URL, map[string]string{"X-Forwarded-For": tc.xff})
		if keys := c.keys(); len(keys) != 1 || keys[0] != tc.key {
			t.Errorf("%s: keyed %v, want %s", tc.xff, keys, tc.key)
		}
	}
}

// With --api-key-header Authorization (keys sent as "Bearer sk-…"), one
// key is one client however its scheme is spelled: "Bearer" or "Token",
// any case, any run of spaces or tabs, as OAuth's and Rails' parsers read
// it. Was: the header's value as sent, 8 spellings of one key passed a
// limit of 1 per key 8 times (a helper attacking the gateway).
func TestAPIKeyInAnAuthorizationHeaderIsItsCredentials(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "per-key", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	s := front(t, newUpstream(t), c, Config{Identity: Identity{APIKeyHeader: "Authorization"}, Routes: []rules.Route{
		{Name: "chat", Path: "/v1/chat/*", Limits: []rules.Limit{{Rule: "per-key", Cost: 1}}},
	}})
	passed := 0
	spellings := []string{"Bearer sk-1", "bearer sk-1", "BEARER sk-1", "Bearer  sk-1", "Bearer\tsk-1", "Token sk-1", "sk-1"}
	for _, v := range spellings {
		if request(t, http.MethodPost, s.URL+"/v1/chat/x", map[string]string{"Authorization": v}).StatusCode == http.StatusOK {
			passed++
		}
	}
	if keys := c.keys(); passed != 1 || keys[0] != "key:sk-1" {
		t.Errorf("one key in %d spellings: %d passed a limit of 1, keyed %q; want 1, key:sk-1", len(spellings), passed, keys)
	}
	// Another scheme, or more than a scheme and a token, is the value as sent.
	for v, want := range map[string]string{"Basic dXNlcg==": "key:Basic dXNlcg==", "Bearer a b": "key:Bearer a b"} {
		c := newChecker(t)
		s := front(t, newUpstream(t), c, Config{Identity: Identity{APIKeyHeader: "Authorization"}})
		get(t, s.URL, map[string]string{"Authorization": v})
		if keys := c.keys(); keys[0] != want {
			t.Errorf("%q keyed %q, want %s", v, keys, want)
		}
	}
}

// A token is taken with its exp, nbf and iat up to 30 s off the
// gateway's clock (an issuer's clock a moment ahead), and with an
// integer id claim (Django REST SimpleJWT's user_id), keyed in decimal.
// Was: both refused (401), every fresh token of such issuers (a helper
// attacking the gateway). Past the leeway, refused still.
func TestTokensOfSkewedClocksAndIntegerIDs(t *testing.T) {
	ks := makeKeys(t)
	now := time.Now()
	for _, tc := range []struct {
		name   string
		claim  string
		claims jwt.MapClaims
		want   int
		key    string
	}{
		{"integer user_id", "user_id", jwt.MapClaims{"user_id": 42, "exp": now.Add(time.Hour).Unix()}, http.StatusOK, "sub:42"},
		{"fractional user_id", "user_id", jwt.MapClaims{"user_id": 4.5, "exp": now.Add(time.Hour).Unix()}, http.StatusUnauthorized, ""},
		{"nbf and iat 2 s ahead", "sub", jwt.MapClaims{"sub": "alice", "iat": now.Add(2 * time.Second).Unix(), "nbf": now.Add(2 * time.Second).Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusOK, "sub:alice"},
		{"expired 10 s ago", "sub", jwt.MapClaims{"sub": "alice", "exp": now.Add(-10 * time.Second).Unix()}, http.StatusOK, "sub:alice"},
		{"nbf 2 min ahead", "sub", jwt.MapClaims{"sub": "alice", "nbf": now.Add(2 * time.Minute).Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusUnauthorized, ""},
		{"expired 2 min ago", "sub", jwt.MapClaims{"sub": "alice", "exp": now.Add(-2 * time.Minute).Unix()}, http.StatusUnauthorized, ""},
	} {
		c := newChecker(t)
		s := front(t, newUpstream(t), c, Config{Identity: Identity{JWT: mustJWT(t, ks.hsSecret), Claim: tc.claim}})
		tok := sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", tc.claims)
		status := get(t, s.URL+"/x", map[string]string{"Authorization": "Bearer " + tok}).StatusCode
		if status != tc.want || tc.key != "" && (len(c.keys()) != 1 || c.keys()[0] != tc.key) {
			t.Errorf("%s: %d, keyed %v; want %d, keyed %s", tc.name, status, c.keys(), tc.want, tc.key)
		}
	}
}

func TestAPIKeyHeaderBeforeIP(t *testing.T) {
	c := newChecker(t)
	s := front(t, newUpstream(t), c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key"}})
	get(t, s.URL, map[string]string{"X-Api-Key": "k-123"})
	get(t, s.URL, nil)
	if got := c.keys(); len(got) != 2 || got[0] != "key:k-123" || got[1] != "ip:127.0.0.1" {
		t.Fatalf("keys %v", got)
	}
}

// A header the request's Connection header names is hop-by-hop: the
// reverse proxy drops it, so the gateway does not key or charge by it
// either. Was: keyed by an X-Api-Key the upstream never got (a fresh
// budget per request, the upstream serving an anonymous caller), and
// charged by a cost header the upstream never saw.
func TestConnectionNamedHeadersAreNotTheCallers(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "big", Algorithm: limiter.SlidingLog, Limit: 100, Period: time.Minute})
	s := front(t, newUpstream(t), c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key"}, Routes: []rules.Route{
		{Name: "api", Path: "/api/*", Limits: []rules.Limit{{Rule: "big", CostFrom: "header:X-Cost"}}},
	}})
	get(t, s.URL+"/api/x", map[string]string{"X-Api-Key": "k-1", "X-Cost": "7", "Connection": "keep-alive, X-Api-Key , x-cost"})
	get(t, s.URL+"/api/x", map[string]string{"X-Api-Key": "k-2", "X-Cost": "3"})
	if got := c.keys(); len(got) != 2 || got[0] != "ip:127.0.0.1" || got[1] != "key:k-2" {
		t.Fatalf("keyed as %v; want the peer's IP for the request whose Connection names X-Api-Key, then key:k-2", got)
	}
	if got := c.remaining(t, "big", "ip:127.0.0.1"); got != 99 {
		t.Fatalf("the request whose Connection names X-Cost left %d of 100; want it charged 1, as without the header", got)
	}
	if got := c.remaining(t, "big", "key:k-2"); got != 97 {
		t.Fatalf("a request with X-Cost: 3 left %d of 100; want 97", got)
	}
}

// Every header on 200 and on 429, and the upstream sees exactly the
// allowed requests.
func TestHeadersAndUpstreamCountEqualsAllowed(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "five", Algorithm: limiter.SlidingLog, Limit: 5, Period: 10 * time.Second})
	up := newUpstream(t)
	clock := time.Unix(1_000_000, 0)
	s := front(t, up, c, Config{Now: func() time.Time { return clock }, Routes: []rules.Route{
		{Name: "api", Path: "/api/*", Limits: []rules.Limit{{Rule: "five", Cost: 1}}},
	}})
	allowed := 0
	for i := range 12 {
		resp := get(t, s.URL+"/api/x", nil)
		h := resp.Header
		switch resp.StatusCode {
		case http.StatusOK:
			allowed++
			want := map[string]string{
				"RateLimit-Policy":      `"five";q=5;w=10`,
				"RateLimit":             fmt.Sprintf(`"five";r=%d;t=10`, 5-allowed),
				"X-RateLimit-Limit":     "5",
				"X-RateLimit-Remaining": fmt.Sprint(5 - allowed),
				"X-RateLimit-Reset":     "1000010",
			}
			for k, v := range want {
				if h.Get(k) != v {
					t.Errorf("request %d: %s = %q, want %q", i, k, h.Get(k), v)
				}
			}
		case http.StatusTooManyRequests:
			want := map[string]string{
				"RateLimit-Policy":      `"five";q=5;w=10`,
				"RateLimit":             `"five";r=0;t=10`,
				"X-RateLimit-Limit":     "5",
				"X-RateLimit-Remaining": "0",
				"X-RateLimit-Reset":     "1000010",
				"Retry-After":           "10",
				"Cache-Control":         "no-store",
				"Content-Type":          "application/json",
			}
			for k, v := range want {
				if h.Get(k) != v {
					t.Errorf("denied request %d: %s = %q, want %q", i, k, h.Get(k), v)
				}
			}
		default:
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if allowed != 5 || up.hits.Load() != 5 {
		t.Fatalf("allowed %d, upstream saw %d; want 5 and 5", allowed, up.hits.Load())
	}
	// The body of a 429.
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/api/x", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body client.Denied
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Error != "rate_limited" || body.RetryAfterSeconds != 10 || body.Message == "" {
		t.Fatalf("429 body %+v", body)
	}
	// No route: unlimited, no headers.
	if resp := get(t, s.URL+"/other", nil); resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("unrouted request: %d %v", resp.StatusCode, resp.Header)
	}
}

// With several limits, all must allow; one that denies leaves the others
// unspent. The headers show the limit with the least remaining.
func TestSeveralLimitsAllMustAllowAndADenialSpendsNothing(t *testing.T) {
	c := newChecker(t,
		limiter.Rule{Name: "rpm", Algorithm: limiter.SlidingLog, Limit: 10, Period: time.Minute},
		limiter.Rule{Name: "tpm", Algorithm: limiter.SlidingWindow, Limit: 100, Period: time.Minute},
	)
	up := newUpstream(t)
	s := front(t, up, c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key"}, Routes: []rules.Route{
		{Name: "chat", Path: "/*", Limits: []rules.Limit{{Rule: "rpm", Cost: 1}, {Rule: "tpm", CostFrom: "header:X-Token-Estimate"}}},
	}})
	send := func(tokens string) *http.Response {
		return get(t, s.URL, map[string]string{"X-Api-Key": "t1", "X-Token-Estimate": tokens})
	}
	if r := send("60"); r.StatusCode != 200 || r.Header.Get("RateLimit") != `"rpm";r=9;t=60` {
		t.Fatalf("first: %d, RateLimit %q", r.StatusCode, r.Header.Get("RateLimit"))
	}
	r := send("50") // tpm has 40 left: denied, rpm unspent
	if r.StatusCode != http.StatusTooManyRequests || !strings.HasPrefix(r.Header.Get("RateLimit-Policy"), `"tpm"`) {
		t.Fatalf("over tpm: %d, policy %q", r.StatusCode, r.Header.Get("RateLimit-Policy"))
	}
	if got := c.remaining(t, "rpm", "key:t1"); got != 9 {
		t.Fatalf("rpm has %d left after a tpm denial, want 9 (one spend)", got)
	}
	if got := c.remaining(t, "tpm", "key:t1"); got != 40 {
		t.Fatalf("tpm has %d left, want 40", got)
	}
	c.mu.Lock()
	last := c.calls[len(c.calls)-1]
	c.mu.Unlock()
	if len(c.calls) != 2 || len(last) != 2 || last[0].Joined || !last[1].Joined {
		t.Fatalf("checker calls %v, want one call a request, the route's limits joined", c.calls)
	}
	// Decimal digits alone, as Content-Length: strconv.ParseInt took a
	// sign, which an upstream reading the header may not.
	for _, v := range []string{"abc", "+5", "-0", "-1", "5 5", "1e3", "0x10", "99999999999999999999", "1, 99"} {
		if r := send(v); r.StatusCode != http.StatusBadRequest {
			t.Fatalf("cost header %q: %d, want 400", v, r.StatusCode)
		}
	}
	// The message says what is wrong: too large is not "not digits".
	for v, says := range map[string]string{"99999999999999999999": "over the largest cost", "1, 99": "given as a list", "+5": "decimal digits"} {
		if _, err := parseCost(v); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("parseCost(%q) = %v, want an error saying %q", v, err, says)
		}
	}
	if got := c.remaining(t, "tpm", "key:t1"); got != 40 {
		t.Fatalf("tpm has %d left after refused cost headers, want 40", got)
	}
	// A cost no window could ever admit is a bad request, not a 429 that
	// tells the client to retry, and spends nothing.
	if r := send("500"); r.StatusCode != http.StatusBadRequest || r.Header.Get("Retry-After") != "" {
		t.Fatalf("cost over the limit: %d (Retry-After %q), want 400", r.StatusCode, r.Header.Get("Retry-After"))
	}
	// The client is told which of the route's limits refused the cost,
	// in the header's terms, not the place of a check in the gateway's
	// own batch (checks[1]), nor the limiter's "cost out of range ...
	// allows 0 to 100" (a forwarded request never costs 0).
	req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
	req.Header.Set("X-Api-Key", "t1")
	req.Header.Set("X-Token-Estimate", "500")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `X-Token-Estimate: 500 is more than rule \"tpm\" allows for one request (at most 100)`) || strings.Contains(string(b), "checks[") {
		t.Fatalf("cost over the limit: body %s, want the header, the cost and the rule's most", b)
	}
	if got := c.remaining(t, "rpm", "key:t1"); got != 9 {
		t.Fatalf("rpm has %d left after a refused cost, want 9", got)
	}
	// A caller saying its request costs 0 is still charged 1: the
	// header is the caller's, and a cost of 0 would spend nothing.
	if r := send("0"); r.StatusCode != 200 {
		t.Fatalf("cost 0: %d, want 200", r.StatusCode)
	}
	if got := c.remaining(t, "tpm", "key:t1"); got != 39 {
		t.Fatalf("tpm has %d left after a request of cost 0, want 39 (charged 1)", got)
	}
	if up.hits.Load() != 2 {
		t.Fatalf("upstream saw %d, want 2", up.hits.Load())
	}
}

// A leaky_bucket route shapes: requests arriving together are released at
// the rule's rate (measured in the bubble's virtual time), and a client
// that leaves while held is never forwarded.
func TestShapedRouteReleasesAtTheRulesRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newChecker(t, limiter.Rule{Name: "shape", Algorithm: limiter.LeakyBucket, Limit: 10, Period: time.Second, Burst: 6})
		var mu sync.Mutex
		var released []time.Time
		g, err := New(Config{Next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			mu.Lock()
			released = append(released, time.Now())
			mu.Unlock()
		}), Routes: []rules.Route{{Name: "s", Path: "/*", Limits: []rules.Limit{{Rule: "shape", Cost: 1}}}}}, c)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var wg sync.WaitGroup
		recs := make([]*httptest.ResponseRecorder, 8)
		gone, leave := context.WithCancel(t.Context())
		for i := range recs {
			ctx := t.Context()
			if i == 3 { // this client leaves while held
				ctx = gone
			}
			req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/x", nil)
			req.RemoteAddr = "192.0.2.1:1234"
			recs[i] = httptest.NewRecorder()
			wg.Go(func() { g.ServeHTTP(recs[i], req) })
			synctest.Wait() // decided (and held) before the next one arrives
		}
		time.Sleep(50 * time.Millisecond)
		leave()
		wg.Wait()
		var spacing []time.Duration
		for i := 1; i < len(released); i++ {
			spacing = append(spacing, released[i].Sub(released[i-1]))
		}
		ms := time.Millisecond
		want := []time.Duration{100 * ms, 100 * ms, 200 * ms, 100 * ms}
		if released[0] != start || fmt.Sprint(spacing) != fmt.Sprint(want) {
			t.Fatalf("released at +%v then spaced %v; want +0s then %v (10/s, the fourth client left)", released[0].Sub(start), spacing, want)
		}
		for i, rec := range recs {
			want := http.StatusOK
			if i >= 6 { // burst 6: six may wait; the rest are refused at once
				want = http.StatusTooManyRequests
			}
			if i == 3 {
				continue // left: nothing was written
			}
			if rec.Code != want {
				t.Errorf("client %d: status %d, want %d", i, rec.Code, want)
			}
		}
	})
}

// A client named twice is refused (400) and spends nothing: two API key
// headers, or two Authorization headers while JWTs are verified. The
// gateway would key on one while the upstream may read the other. Was:
// keyed on the first, both forwarded.
func TestAmbiguousIdentityIsRefused(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t)
	up := newUpstream(t)
	s := front(t, up, c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key", JWT: mustJWT(t, ks.hsSecret)}})
	tok := sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", jwt.MapClaims{"sub": "a"})
	for _, h := range []http.Header{
		{"X-Api-Key": {"made-up", "real"}},
		{"Authorization": {"Bearer " + tok, "Bearer " + tok}},
	} {
		resp, body := requestHeader(t, http.MethodGet, s.URL+"/x", h)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "ambiguous client identity") {
			t.Errorf("%v: %d %s, want 400 ambiguous", h, resp.StatusCode, body)
		}
	}
	if len(c.keys()) != 0 || up.hits.Load() != 0 {
		t.Fatalf("refused requests spent %v and reached the upstream %d times", c.keys(), up.hits.Load())
	}
	// Without JWTs, Authorization is the upstream's business.
	noJWT := front(t, up, c, Config{})
	req, _ := http.NewRequest(http.MethodGet, noJWT.URL+"/x", nil)
	req.Header["Authorization"] = []string{"Basic a", "Basic b"}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("two Authorization headers without --jwt-key: %d, want 200", resp.StatusCode)
	}
}

// Routes are matched against the path an upstream serves: dot segments
// resolved and repeated slashes merged; and a route for GET limits HEAD.
// Was: "//closed/a" and "/x/../closed/a" went past /closed/*'s limit
// (forwarded as they came, to an upstream that serves them as
// /closed/a), and HEAD past a GET route's.
func TestRoutesMatchTheResolvedPath(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "one", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	up := newUpstream(t)
	s := front(t, up, c, Config{Routes: []rules.Route{
		{Name: "closed", Path: "/closed/*", Methods: []string{"GET"}, Limits: []rules.Limit{{Rule: "one", Cost: 1}}},
	}})
	do := func(method, path string) int {
		req, _ := http.NewRequest(method, s.URL, nil)
		req.URL.Path = path // sent as written: Go's client resolves nothing
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := do(http.MethodGet, "/closed/a"); got != http.StatusOK {
		t.Fatalf("first: %d", got)
	}
	for _, p := range []string{"//closed/a", "/x/../closed/a", "/closed/./a", "/closed//a"} {
		if got := do(http.MethodGet, p); got != http.StatusTooManyRequests {
			t.Errorf("GET %s: %d, want 429 (the route's limit is spent)", p, got)
		}
	}
	if got := do(http.MethodHead, "/closed/a"); got != http.StatusTooManyRequests {
		t.Errorf("HEAD on a GET route: %d, want 429", got)
	}
	if got := do(http.MethodPost, "/closed/a"); got != http.StatusOK {
		t.Errorf("POST on a GET route: %d, want 200 (not routed)", got)
	}
	if up.hits.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want 2 (the first GET and the POST)", up.hits.Load())
	}
}

// A path that differs from a limited route's only by trailing slashes,
// written or encoded, is limited by that route; an encoded slash is a
// slash. Was: with "/login" limited to 3, "/login/" and "/login%2F"
// matched no route and passed unlimited, without rate-limit headers, to
// upstreams that serve them as "/login".
func TestTrailingSlashIsLimitedByTheRoute(t *testing.T) {
	c := newChecker(t,
		limiter.Rule{Name: "three", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Minute},
		limiter.Rule{Name: "three-ab", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Minute})
	up := newUpstream(t)
	s := front(t, up, c, Config{Routes: []rules.Route{
		{Name: "login", Path: "/login", Limits: []rules.Limit{{Rule: "three", Cost: 1}}},
		{Name: "ab", Path: "/a/b", Limits: []rules.Limit{{Rule: "three-ab", Cost: 1}}},
	}})
	for i, tc := range []struct {
		path string
		want int
	}{
		{"/login", 200}, {"/login/", 200}, {"/login%2F", 200},
		{"/login%2F", 429}, {"/login/", 429}, {"/login//", 429}, {"/login%2f%2F", 429}, {"/login", 429},
		{"/a%2Fb", 200}, {"/a/b/", 200}, {"/a%2Fb%2F", 200}, {"/a/b", 429},
	} {
		resp := get(t, s.URL+tc.path, nil)
		if resp.StatusCode != tc.want || resp.Header.Get("RateLimit") == "" {
			t.Errorf("%d: GET %s: %d (RateLimit %q), want %d with rate-limit headers", i, tc.path, resp.StatusCode, resp.Header.Get("RateLimit"), tc.want)
		}
	}
	if up.hits.Load() != 6 {
		t.Errorf("upstream saw %d requests, want 6", up.hits.Load())
	}
}

// A limit with key: ip is keyed by the client IP ("ip:ADDR", as the
// identity chain keys it), whatever API key or token the request
// carries: a caller that makes up a new API key per request, or leaves
// out its token, gets a new per-client budget each time but one per-IP
// budget. Was: every limit was keyed by the identity chain, and a
// brute-force limit on /login stopped nothing for a caller that rotated
// keys.
func TestPerIPLimitHoldsACallerRotatingAPIKeys(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t,
		limiter.Rule{Name: "per-client", Algorithm: limiter.SlidingLog, Limit: 2, Period: time.Minute},
		limiter.Rule{Name: "per-ip", Algorithm: limiter.SlidingLog, Limit: 3, Period: time.Minute})
	up := newUpstream(t)
	trusted, _ := ParseCIDRs("127.0.0.0/8")
	s := front(t, up, c, Config{
		Identity: Identity{JWT: mustJWT(t, ks.hsSecret), APIKeyHeader: "X-Api-Key", TrustedProxies: trusted},
		Routes: []rules.Route{{Name: "login", Path: "/login", Limits: []rules.Limit{
			{Rule: "per-client", Cost: 1}, {Rule: "per-ip", Cost: 1, Key: rules.KeyIP},
		}}},
	})
	alice := "Bearer " + sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	for i, tc := range []struct {
		xff, apiKey, auth string
		want              int
	}{
		{"203.0.113.7", "k1", "", 200},
		{"203.0.113.7", "k2", "", 200},
		{"203.0.113.7", "", alice, 200},
		{"203.0.113.7", "k3", "", 429}, // a fresh API key: per-client has 2 left, per-ip none
		{"203.0.113.7", "", alice, 429},
		{"203.0.113.8", "k4", "", 200}, // another address has its own budget
		{"203.0.113.8", "k4", "", 200},
		{"203.0.113.8", "k4", "", 429}, // per-client spent
	} {
		hdr := map[string]string{"X-Forwarded-For": tc.xff}
		if tc.apiKey != "" {
			hdr["X-Api-Key"] = tc.apiKey
		}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		if resp := get(t, s.URL+"/login", hdr); resp.StatusCode != tc.want {
			t.Errorf("%d: from %s, API key %q: %d, want %d", i, tc.xff, tc.apiKey, resp.StatusCode, tc.want)
		}
	}
	if got := c.keys()[:4]; !slices.Equal(got, []string{"key:k1", "ip:203.0.113.7", "key:k2", "ip:203.0.113.7"}) {
		t.Errorf("keys %q, want each limit keyed by its own kind", got)
	}
	if got := c.remaining(t, "per-client", "key:k3"); got != 2 {
		t.Errorf("per-client has %d left for k3 after a per-ip denial, want 2 (nothing spent)", got)
	}
	if got := c.remaining(t, "per-ip", "ip:203.0.113.8"); got != 1 {
		t.Errorf("per-ip has %d left for 203.0.113.8 after a per-client denial, want 1", got)
	}
	if up.hits.Load() != 5 {
		t.Errorf("upstream saw %d requests, want 5", up.hits.Load())
	}
}

func mustJWT(t *testing.T, key []byte) *JWTKeys {
	t.Helper()
	k, err := ParseJWTKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// An API key too long for a bucket key, or not UTF-8, is limited under
// its SHA-256, in a kind of its own. Was: 400 "checks[0]: bad request:
// key is 1034 bytes", naming the gateway's internal batch.
func TestLongOrBinaryAPIKeysAreHashed(t *testing.T) {
	c := newChecker(t)
	up := newUpstream(t)
	s := front(t, up, c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key"}})
	long := strings.Repeat("k", 2000)
	for _, v := range []string{long, "\xff\xfe", "short"} {
		if resp := get(t, s.URL+"/x", map[string]string{"X-Api-Key": v}); resp.StatusCode != http.StatusOK {
			t.Errorf("API key of %d bytes: %d, want 200", len(v), resp.StatusCode)
		}
	}
	got := c.keys()
	if len(got) != 3 || !strings.HasPrefix(got[0], "keyh:") || len(got[0]) != len("keyh:")+64 ||
		!strings.HasPrefix(got[1], "keyh:") || got[0] == got[1] || got[2] != "key:short" {
		t.Fatalf("keys %q", got)
	}
}

// Lines a client's requests repeat at their rate are logged once per
// window, and upstream failures are counted. Was: a WARN per request
// with the upstream down, an ERROR per request for a route naming a rule
// the cluster lacks (1000 requests, 1000 lines), and the 502s counted
// only as "allowed".
func TestRepeatedFailuresLogOnceAndCount(t *testing.T) {
	c := newChecker(t)
	down := newUpstream(t)
	down.Close() // nothing answers there
	var logs logbuf.Buffer
	clock := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	reg := prometheus.NewRegistry()
	s := front(t, down, c, Config{Now: now, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Routes: []rules.Route{
		{Name: "missing", Path: "/missing", Limits: []rules.Limit{{Rule: "nosuchrule", Cost: 1}}},
		{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "default", Cost: 1}}},
	}})
	for range 20 {
		if resp := get(t, s.URL+"/x", nil); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("upstream down: %d, want 502", resp.StatusCode)
		}
		if resp := get(t, s.URL+"/missing", nil); resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("missing rule: %d, want 500", resp.StatusCode)
		}
	}
	count := func(msg string) int { return strings.Count(logs.String(), msg) }
	if w, e := count(`msg="gateway: upstream failed"`), count(`msg="gateway: a route names a rule the cluster does not have"`); w != 1 || e != 1 {
		t.Fatalf("%d upstream and %d missing-rule lines for 20 requests each, want 1 and 1:\n%s", w, e, logs.String())
	}
	mu.Lock()
	clock = clock.Add(logWindow)
	mu.Unlock()
	get(t, s.URL+"/x", nil)
	if !strings.Contains(logs.String(), `msg="gateway: upstream failed (19 more in 30s)"`) {
		t.Fatalf("the next line after the window does not count the 19 held back:\n%s", logs.String())
	}
	if got, slow := upstreamErrors(t, reg, "502"), upstreamErrors(t, reg, "504"); got != 21 || slow != 0 {
		t.Fatalf("upstream errors %v (502) and %v (504), want 21 and 0", got, slow)
	}
}

// An upstream that cuts its answer off after the headers is counted as
// an upstream failure (502), and the reverse proxy's line for it is
// logged once per window. Was: not counted, and one WARN line (the
// proxy's own, unthrottled) per request.
func TestUpstreamCutOffMidBodyIsCountedAndLoggedOnce(t *testing.T) {
	c := newChecker(t)
	up := &upstream{}
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, strings.Repeat("x", 1000))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(up.Close)
	var logs logbuf.Buffer
	reg := prometheus.NewRegistry()
	s := front(t, up, c, Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 5 {
		resp, err := http.Get(s.URL + "/x")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if got := upstreamErrors(t, reg, "502"); got != 5 {
		t.Fatalf("%v upstream errors (502) for 5 answers cut off; want 5", got)
	}
	if n := strings.Count(logs.String(), `msg="gateway: upstream answer cut off"`); n != 1 {
		t.Fatalf("%d lines for 5 answers cut off; want 1:\n%s", n, logs.String())
	}
}

// An exemption does not cover a path sent with an encoded slash or
// backslash that decodes onto it (/public/%2F is /public// is /public/):
// the routes after it decide. Other escapes are read decoded (%c3%a9 as
// %C3%A9 as é). Was: /public/%2F exempt, though an upstream that keeps
// %2F in a segment serves it as a resource under /public/*, whose limit
// it then escaped.
func TestExemptionCoversThePathAsSent(t *testing.T) {
	up := newUpstream(t)
	for _, tc := range []struct {
		path   string
		exempt bool
	}{
		{"/public/%2F", false},
		{"/public/%2f", false},
		{"/public/%5C", false},
		{"/public/", true},
		{"/caf%C3%A9", true},
		{"/caf%c3%a9", true},
		{"/caf%c3%a9/", false}, // an exemption keeps its trailing slash (or none)
	} {
		c := newChecker(t, limiter.Rule{Name: "one", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
		s := front(t, up, c, Config{Routes: []rules.Route{
			{Name: "exempt", Path: "/public/", Unlimited: true},
			{Name: "cafe", Path: "/café", Unlimited: true},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "one", Cost: 1}}},
		}})
		want := []int{http.StatusOK, http.StatusOK}
		if !tc.exempt {
			want[1] = http.StatusTooManyRequests
		}
		for i, w := range want {
			if resp := get(t, s.URL+tc.path, nil); resp.StatusCode != w {
				t.Fatalf("%s, request %d: %d, want %d (exempt: %v)", tc.path, i, resp.StatusCode, w, tc.exempt)
			}
		}
	}
}

// A backslash, sent as is or encoded in either case, is never exempt and
// is matched as a slash, as an upstream that takes it for one reads it.
// Was: /static/%5C, /static/..%5Cadmin and /static/..\admin exempt under
// /static/* (Go leaves RawPath empty for %5C, its own encoding of a
// backslash, and a literal one was never looked for), and /admin%5Cusers
// past /admin/users's limit (a helper attacking the gateway).
func TestBackslashIsASlashAndNeverExempt(t *testing.T) {
	up := newUpstream(t)
	for _, tc := range []struct {
		target string // the request target as sent
		rule   string // the rule that limits it
	}{
		{"/static/%5C", "all"},
		{"/static/%5c", "all"},
		{"/static/a%5Cb", "all"},
		{"/static/..%5Cadmin%5Cusers", "adm"},
		{"/static/..\\admin\\users", "adm"},
		{"/admin%5Cusers", "adm"},
		{"/admin\\users", "adm"},
	} {
		hour := func(name string) limiter.Rule {
			return limiter.Rule{Name: name, Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour}
		}
		c := newChecker(t, hour("adm"), hour("all"))
		s := front(t, up, c, Config{Routes: []rules.Route{
			{Name: "exempt", Path: "/static/*", Unlimited: true},
			{Name: "admin", Path: "/admin/users", Limits: []rules.Limit{{Rule: "adm", Cost: 1}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
		}})
		for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			status, policy := rawGet(t, s.Listener.Addr().String(), tc.target)
			if status != want || !strings.HasPrefix(policy, `"`+tc.rule+`"`) {
				t.Fatalf("%s, request %d: %d with RateLimit-Policy %q; want %d, limited by %s", tc.target, i, status, policy, want, tc.rule)
			}
		}
	}
}

// A path is charged under the route of every reading an upstream may
// make of it (readings): as sent, resolved; without its ";" parameters,
// as a servlet container (Tomcat, Jetty) reads it, cut as sent or
// decoded; with its dot segments kept, as Express reads it. It is
// exempt only when every reading is. Was: matched in the first reading
// alone, so "/login;jsessionid=1" went past "/login"'s limit (charged
// under "/*" only), and "/static/..;/admin/users" was exempt under
// "/static/*", forwarded to an upstream that serves "/admin/users"; then
// (b03617b: parameters cut after decoding) "/login;%2F.." still went
// past, "/admin/%3B/..;/users" was charged as "/users", and
// "/admin/users/../../static/x" was exempt (a helper attacking the
// gateway).
func TestPathParametersAreMatchedBothWays(t *testing.T) {
	up := newUpstream(t)
	probe := map[string]string{"lg": "/login", "adm": "/admin/users", "all": "/other"}
	for _, tc := range []struct {
		target  string
		charged []string // the rules the request spent
	}{
		{"/login;jsessionid=1", []string{"all", "lg"}},
		{"/static/..;/admin/users", []string{"adm"}},
		{"/static/x/..;/..;/admin/users;a=b", []string{"adm"}},
		{"/admin;x/users", []string{"all", "adm"}},
		{"/static/logo.png;v=2", nil},
		{"/other;x", []string{"all"}},
		// Tomcat ends a parameter at a "/" sent as such, not at %2F: it
		// serves /login (and /admin/users).
		{"/login;%2F..", []string{"all", "lg"}},
		{"/login;jsessionid=x%2F..%2F..", []string{"all", "lg"}},
		{"/admin;%2F../users", []string{"all", "adm"}},
		// Tomcat takes %3B for a name, not a parameter: /admin/users.
		{"/admin/%3B/..;/users", []string{"all", "adm"}},
		// An upstream that resolves no dot segment (Express) serves a
		// path under /admin/users, not /static/x: not exempt.
		{"/admin/users/../../static/x", []string{"all"}},
		{"/admin/users/%2E%2E/%2e%2E/static/x", []string{"all"}},
		{"/static/./x", nil},
		// Node's URL parser, Kestrel, nginx without merge_slashes: ".."
		// removes the empty segment, /admin/users.
		{"/admin//../users", []string{"all", "adm"}},
		// Spring's PathPattern: parameters cut, dots kept: admin, "..", users.
		{"/static/..;/admin/users;x", []string{"adm"}},
		// Express (by default), ASP.NET and IIS route case-insensitively.
		{"/LOGIN", []string{"all", "lg"}},
		{"/Login/", []string{"all", "lg"}},
		{"/STATIC/app.js", []string{"all"}},
		// Rails' optional (.:format).
		{"/login.json", []string{"all", "lg"}},
		{"/login.json/", []string{"all", "lg"}},
		{"/static/app.js", nil},
		// A PHP front controller routes the path after its script.
		{"/index.php/login", []string{"all", "lg"}},
		{"/index.php/admin/users.json", []string{"all", "adm"}},
		// Symfony takes the script as a string prefix: /login.
		{"/index.phplogin", []string{"all", "lg"}},
		{"/index%2Ephplogin", []string{"all", "lg"}},
		// Java's equalsIgnoreCase reads a dotless i as an i.
		{"/log%C4%B1n", []string{"all", "lg"}},
	} {
		hour := func(name string) limiter.Rule {
			return limiter.Rule{Name: name, Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour}
		}
		c := newChecker(t, hour("lg"), hour("adm"), hour("all"))
		s := front(t, up, c, Config{Routes: []rules.Route{
			{Name: "exempt", Path: "/static/*", Unlimited: true},
			{Name: "login", Path: "/login", Limits: []rules.Limit{{Rule: "lg", Cost: 1}}},
			{Name: "admin", Path: "/admin/users", Limits: []rules.Limit{{Rule: "adm", Cost: 1}}},
			{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "all", Cost: 1}}},
		}})
		addr := s.Listener.Addr().String()
		if status, _ := rawGet(t, addr, tc.target); status != http.StatusOK {
			t.Fatalf("%s: %d, want 200", tc.target, status)
		}
		for _, rule := range []string{"lg", "adm", "all"} {
			want := http.StatusOK
			if slices.Contains(tc.charged, rule) {
				want = http.StatusTooManyRequests
			}
			if status, _ := rawGet(t, addr, probe[rule]); status != want {
				t.Errorf("%s, then %s (rule %s): %d, want %d (charged: %v)", tc.target, probe[rule], rule, status, want, tc.charged)
			}
		}
	}
}

// rawDo sends a request of method for target, byte for byte, with the
// header lines given, to addr and returns the answer's status.
func rawDo(t *testing.T, addr, method, target string, header ...string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n", method, target)
	for _, h := range header {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// rawGet sends GET target, byte for byte, to addr and returns the answer's
// status and RateLimit-Policy.
func rawGet(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("RateLimit-Policy")
}

// upstreamErrors is the gateway's upstream error count in reg for
// answer status.
func upstreamErrors(t *testing.T, reg *prometheus.Registry, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ringlimit_gateway_upstream_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if lp := m.GetLabel(); len(lp) == 1 && lp[0].GetName() == "status" && lp[0].GetValue() == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no upstream error series for status %s", status)
	return 0
}

// An upstream with rate-limit headers of its own: the client gets one
// X-RateLimit-* of each, the gateway's, and both policies in the
// RateLimit lists. Was: two X-RateLimit-Remaining, the upstream's last.
func TestUpstreamRateLimitHeadersDoNotDoubleTheGateways(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "five", Algorithm: limiter.SlidingLog, Limit: 5, Period: 10 * time.Second})
	up := &upstream{}
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-RateLimit-Limit", "1000")
		h.Set("X-RateLimit-Remaining", "999")
		h.Set("X-RateLimit-Reset", "1")
		h.Set("RateLimit-Policy", `"upstream";q=1000;w=60`)
		h.Set("RateLimit", `"upstream";r=999;t=60`)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	clock := time.Unix(1_000_000, 0)
	s := front(t, up, c, Config{Now: func() time.Time { return clock }, Routes: []rules.Route{
		{Name: "api", Path: "/*", Limits: []rules.Limit{{Rule: "five", Cost: 1}}},
	}})
	resp := get(t, s.URL+"/x", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	want := map[string][]string{
		"X-RateLimit-Limit":     {"5"},
		"X-RateLimit-Remaining": {"4"},
		"X-RateLimit-Reset":     {"1000010"},
		"RateLimit-Policy":      {`"five";q=5;w=10`, `"upstream";q=1000;w=60`},
		"RateLimit":             {`"five";r=4;t=10`, `"upstream";r=999;t=60`},
	}
	for k, v := range want {
		if got := resp.Header.Values(k); !slices.Equal(got, v) {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// Routes marked unlimited let health checks and CORS preflights through a
// catch-all route unchecked: no budget spent, no rate-limit headers, and
// counted as unlimited under the route's name. Was: a route needed 1 to
// 16 limits, so "/*" limited /healthz and every OPTIONS.
func TestUnlimitedRoutesPassUnchecked(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "one", Algorithm: limiter.SlidingLog, Limit: 1, Period: time.Hour})
	up := newUpstream(t)
	reg := prometheus.NewRegistry()
	s := front(t, up, c, Config{Registerer: reg, Routes: []rules.Route{
		{Name: "health", Path: "/healthz", Unlimited: true},
		{Name: "preflight", Methods: []string{http.MethodOptions}, Path: "/*", Unlimited: true},
		{Name: "all", Path: "/*", Limits: []rules.Limit{{Rule: "one", Cost: 1}}},
	}})
	do := func(method, path string) *http.Response {
		t.Helper()
		return request(t, method, s.URL+path, nil)
	}
	for i := range 3 {
		for _, q := range [][2]string{{http.MethodGet, "/healthz"}, {http.MethodOptions, "/api"}} {
			resp := do(q[0], q[1])
			if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") != "" || resp.Header.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("%s %s #%d: %d with RateLimit %q; want 200 without rate-limit headers", q[0], q[1], i, resp.StatusCode, resp.Header.Get("RateLimit"))
			}
		}
	}
	if got := c.keys(); len(got) != 0 {
		t.Fatalf("unlimited routes spent budget under keys %q", got)
	}
	if resp := do(http.MethodGet, "/api"); resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") == "" {
		t.Fatalf("GET /api: %d, RateLimit %q; want 200 with headers (the catch-all's first)", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	if resp := do(http.MethodGet, "/api"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second GET /api: %d, want 429", resp.StatusCode)
	}
	if got := up.hits.Load(); got != 7 {
		t.Errorf("upstream saw %d requests, want 7 (6 unlimited, 1 allowed)", got)
	}
	for route, want := range map[string]float64{"health": 3, "preflight": 3} {
		if got := outcomeCount(t, reg, route, "unlimited"); got != want {
			t.Errorf("outcome unlimited of route %s = %v, want %v", route, got, want)
		}
	}
}

// outcomeCount reads ringlimit_gateway_requests_total{route, outcome}.
func outcomeCount(t *testing.T, reg *prometheus.Registry, route, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ringlimit_gateway_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A weighted cost header given twice is refused (400) and spends
// nothing, as one line "1, 99" is. Was: the first value spent (1) while
// the upstream got both and could read 99. So is one spelled with
// underscores (X_Token_Estimate), which CGI, WSGI and Rack upstreams read
// as the header: was forwarded while the gateway charged 1 (a helper
// attacking the gateway: 300 tokens through a limit of 100).
func TestRepeatedCostHeaderIsRefused(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "tpm", Algorithm: limiter.SlidingWindow, Limit: 100, Period: time.Minute})
	up := newUpstream(t)
	s := front(t, up, c, Config{Routes: []rules.Route{
		{Name: "chat", Path: "/*", Limits: []rules.Limit{{Rule: "tpm", CostFrom: "header:X-Token-Estimate"}}},
	}})
	for _, h := range []http.Header{
		{"X-Token-Estimate": {"1", "99"}},
		{"X-Token-Estimate": {"1, 99"}},
		{"X-Token-Estimate": {"5", "5"}},
		{"X_Token_Estimate": {"100"}},
		{"X-Token-Estimate": {"1"}, "X_token_estimate": {"99"}},
		{"X-Token_Estimate": {"100"}},
	} {
		resp, body := requestHeader(t, http.MethodPost, s.URL+"/chat", h)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "X-Token-Estimate") {
			t.Errorf("%v: %d %s, want 400 naming the header", h, resp.StatusCode, body)
		}
	}
	if len(c.keys()) != 0 || up.hits.Load() != 0 {
		t.Fatalf("refused requests spent %v and reached the upstream %d times", c.keys(), up.hits.Load())
	}
	if rem := c.remaining(t, "tpm", "ip:127.0.0.1"); rem != 100 {
		t.Fatalf("remaining %d, want 100: nothing spent", rem)
	}
}

// A request that matches no route, or an unlimited one, is forwarded
// whatever its token or API-key headers say: a token-refresh endpoint
// receives expired tokens. The client is identified when a limit will be
// checked, or when its tier decides the route (a token that fails is
// then refused), and a refusal counts under its route. Was: identified first, so 401 and 400 on routes the
// gateway does not limit, counted under route "".
func TestUnlimitedAndUnmatchedRequestsAreNotIdentified(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t)
	up := newUpstream(t)
	reg := prometheus.NewRegistry()
	s := front(t, up, c, Config{Registerer: reg, Identity: Identity{APIKeyHeader: "X-Api-Key", JWT: mustJWT(t, ks.hsSecret), TierClaim: "plan"},
		Routes: []rules.Route{
			{Name: "refresh", Path: "/v1/refresh", Unlimited: true},
			{Name: "pro", Path: "/v1/*", Tier: "pro", Limits: []rules.Limit{{Rule: "default", Cost: 1}}},
			{Name: "api", Path: "/api/*", Limits: []rules.Limit{{Rule: "default", Cost: 1}}},
		}})
	expired := "Bearer " + sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", jwt.MapClaims{"sub": "a", "plan": "pro", "exp": time.Now().Add(-time.Hour).Unix()})
	do := func(path string, h http.Header) int {
		t.Helper()
		resp, _ := requestHeader(t, http.MethodGet, s.URL+path, h)
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path string
		h    http.Header
		want int
	}{
		{"/v1/refresh", http.Header{"Authorization": {expired}}, http.StatusOK},
		{"/v1/refresh", http.Header{"X-Api-Key": {"a", "b"}}, http.StatusOK},
		{"/elsewhere", http.Header{"Authorization": {expired}}, http.StatusOK},
		{"/elsewhere", http.Header{"X-Api-Key": {"a", "b"}}, http.StatusOK},
		{"/api/x", http.Header{"Authorization": {expired}}, http.StatusUnauthorized},
		{"/api/x", http.Header{"X-Api-Key": {"a", "b"}}, http.StatusBadRequest},
		// The tier decides whether /v1/chat is "pro"'s: a token that
		// fails is refused there.
		{"/v1/chat", http.Header{"Authorization": {expired}}, http.StatusUnauthorized},
	} {
		if got := do(tc.path, tc.h); got != tc.want {
			t.Errorf("GET %s %v: %d, want %d", tc.path, tc.h, got, tc.want)
		}
	}
	if len(c.keys()) != 0 || up.hits.Load() != 4 {
		t.Fatalf("spent %v, upstream saw %d; want nothing spent, 4 forwarded", c.keys(), up.hits.Load())
	}
	for _, q := range [][3]string{{"refresh", "unlimited", "2"}, {"", "unlimited", "2"}, {"api", "unauthorized", "1"}, {"api", "bad_request", "1"}, {"pro", "unauthorized", "1"}} {
		if got := outcomeCount(t, reg, q[0], q[1]); fmt.Sprint(got) != q[2] {
			t.Errorf("outcome %s of route %q = %v, want %s", q[1], q[0], got, q[2])
		}
	}
}

// A Bearer credential is read whatever spaces or tabs separate scheme
// and token, and a Bearer header with no token is refused: neither is
// "no token". Was: "Bearer<TAB>token" and "Bearer" alone fell through
// to the API key or IP, while an upstream splitting on whitespace took
// the token's subject: a made-up API key escaped the subject's limit.
func TestMalformedBearerIsNotNoToken(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t)
	s := front(t, newUpstream(t), c, Config{Identity: Identity{APIKeyHeader: "X-Api-Key", JWT: mustJWT(t, ks.hsSecret)}})
	tok := sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", jwt.MapClaims{"sub": "alice"})
	for _, tc := range []struct {
		auth    string
		want    int
		wantKey string
	}{
		{"Bearer\t" + tok, http.StatusOK, "sub:alice"},
		{"bearer  \t " + tok + " ", http.StatusOK, "sub:alice"},
		{"Bearer", http.StatusUnauthorized, ""},
		{"Bearer \t", http.StatusUnauthorized, ""},
		{"Bearerx" + tok, http.StatusOK, "key:k"}, // another scheme: the upstream's business
	} {
		before := len(c.keys())
		resp := get(t, s.URL+"/x", map[string]string{"Authorization": tc.auth, "X-Api-Key": "k"})
		keys := c.keys()[before:]
		if resp.StatusCode != tc.want || (tc.wantKey == "") != (len(keys) == 0) || (len(keys) > 0 && keys[0] != tc.wantKey) {
			t.Errorf("Authorization %q: %d keyed %v; want %d keyed %q", tc.auth, resp.StatusCode, keys, tc.want, tc.wantKey)
		}
	}
}

// A limiter with no view yet answers 503 with Retry-After.
func TestUnavailableCarriesRetryAfter(t *testing.T) {
	s := front(t, newUpstream(t), noView{}, Config{})
	resp := get(t, s.URL+"/x", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("no view: %d Retry-After %q, want 503 with Retry-After: 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// noView is a Checker before its first cluster view.
type noView struct{}

func (noView) View() *router.View { return nil }
func (noView) Check(context.Context, []router.Request, []router.Result) error {
	return fmt.Errorf("%w: no cluster view yet", api.ErrUnavailable)
}

// A shaped request with a body whose client gives up while it is held
// is never forwarded: over a real connection, a client with a short
// timeout. The hold lasts until the test releases it, so the client
// has surely gone by then. Was: forwarded, since net/http notices a
// closed connection only after the handler read the body to its end.
// A body over HeldBodyLimit still reaches the upstream whole.
func TestHeldClientWithABodyThatLeavesIsNotForwarded(t *testing.T) {
	c := newChecker(t, limiter.Rule{Name: "shape", Algorithm: limiter.LeakyBucket, Limit: 1, Period: time.Hour, Burst: 5})
	var hits atomic.Int64
	var got sync.Map // body length seen by the upstream, by path
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		got.Store(r.URL.Path, len(b))
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	release := make(chan time.Time)
	g, err := New(Config{Upstream: u, HeldBodyLimit: 1024, After: func(time.Duration) <-chan time.Time { return release },
		Routes: []rules.Route{{Name: "s", Path: "/*", Limits: []rules.Limit{{Rule: "shape", Cost: 1}}}}}, c)
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan string, 4)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { returned <- r.URL.Path }()
		g.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	post := func(hc *http.Client, path string, n int) error {
		resp, err := hc.Post(s.URL+path, "application/json", strings.NewReader(strings.Repeat("x", n)))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	if err := post(http.DefaultClient, "/first", 10); err != nil || <-returned != "/first" {
		t.Fatalf("first (not held): %v", err)
	}
	// Held: the client gives up after 50 ms and closes its connection.
	impatient := &http.Client{Timeout: 50 * time.Millisecond, Transport: &http.Transport{}}
	if err := post(impatient, "/left", 100); err == nil {
		t.Fatal("the held request answered before its release")
	}
	select {
	case p := <-returned:
		if p != "/left" {
			t.Fatalf("%s returned", p)
		}
	case <-time.After(10 * time.Second): // bounds a failure only
		close(release)
		<-returned
		t.Fatalf("the gateway did not notice its held client leave; upstream saw %d requests", hits.Load())
	}
	// A body over the limit is held whole and forwarded whole.
	done := make(chan error, 1)
	go func() { done <- post(http.DefaultClient, "/big", 5000) }()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := got.Load("/big"); n != 5000 {
		t.Fatalf("upstream got %v bytes of the big body, want 5000", n)
	}
	if hits.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want 2 (the one that left was not forwarded)", hits.Load())
	}
}

// With Identity.Audience and Issuer set, a verified token must name that
// audience in aud (a string, or a list holding it) and that issuer in
// iss: one without, or with others, is refused 401 like a forged one and
// spends nothing; unset, neither claim is looked at.
func TestJWTAudienceAndIssuerAreChecked(t *testing.T) {
	ks := makeKeys(t)
	c := newChecker(t)
	up := newUpstream(t)
	var logs logbuf.Buffer
	checked := front(t, up, c, Config{Identity: Identity{JWT: mustJWT(t, ks.hsSecret), Audience: "ringlimit-api", Issuer: "https://auth.example"},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	unchecked := front(t, up, c, Config{Identity: Identity{JWT: mustJWT(t, ks.hsSecret)}})
	const aud, iss = "ringlimit-api", "https://auth.example"
	for _, tc := range []struct {
		name   string
		s      *httptest.Server
		claims jwt.MapClaims // sub is added: the row's name
		want   int
	}{
		{"right aud and iss", checked, jwt.MapClaims{"aud": aud, "iss": iss}, http.StatusOK},
		{"aud list holding it", checked, jwt.MapClaims{"aud": []string{"other", aud}, "iss": iss}, http.StatusOK},
		{"wrong aud", checked, jwt.MapClaims{"aud": "other", "iss": iss}, http.StatusUnauthorized},
		{"aud list without it", checked, jwt.MapClaims{"aud": []string{"other", "more"}, "iss": iss}, http.StatusUnauthorized},
		{"aud of another case", checked, jwt.MapClaims{"aud": "RINGLIMIT-API", "iss": iss}, http.StatusUnauthorized},
		{"empty aud", checked, jwt.MapClaims{"aud": "", "iss": iss}, http.StatusUnauthorized},
		{"no aud", checked, jwt.MapClaims{"iss": iss}, http.StatusUnauthorized},
		{"wrong iss", checked, jwt.MapClaims{"aud": aud, "iss": "https://evil.example"}, http.StatusUnauthorized},
		{"iss with a trailing slash", checked, jwt.MapClaims{"aud": aud, "iss": iss + "/"}, http.StatusUnauthorized},
		{"no iss", checked, jwt.MapClaims{"aud": aud}, http.StatusUnauthorized},
		{"neither", checked, jwt.MapClaims{}, http.StatusUnauthorized},
		{"unchecked: other aud and iss", unchecked, jwt.MapClaims{"aud": "other", "iss": "https://evil.example"}, http.StatusOK},
		{"unchecked: neither", unchecked, jwt.MapClaims{}, http.StatusOK},
	} {
		claims := jwt.MapClaims{"sub": tc.name, "exp": time.Now().Add(time.Hour).Unix()}
		for k, v := range tc.claims {
			claims[k] = v
		}
		hits := up.hits.Load()
		resp := get(t, tc.s.URL+"/x", map[string]string{"Authorization": "Bearer " + sign(t, jwt.SigningMethodHS256, ks.hsSecret, "", claims)})
		wantLeft, wantHits := int64(200), hits
		if tc.want == http.StatusOK {
			wantLeft, wantHits = 199, hits+1
		}
		left := c.remaining(t, "default", "sub:"+tc.name)
		if resp.StatusCode != tc.want || left != wantLeft || up.hits.Load() != wantHits {
			t.Errorf("%s: status %d, %d left, upstream +%d; want %d, %d left, +%d",
				tc.name, resp.StatusCode, left, up.hits.Load()-hits, tc.want, wantLeft, wantHits-hits)
		}
	}
	// The operator is told why (the first refusal of the window: a wrong
	// audience), never the token.
	if l := logs.String(); !strings.Contains(l, `msg="gateway: bearer token refused"`) || !strings.Contains(l, "invalid audience") || strings.Contains(l, "eyJ") {
		t.Errorf("a refused token's log line should say why, without the token:\n%s", l)
	}
}

// An upstream that does not send its response headers within the
// Transport's ResponseHeaderTimeout is answered 504 gateway_timeout,
// counted and logged as an upstream failure; an unreachable one is
// still 502 bad_gateway, and a prompt one passes. Was: 502 for both.
// The slow upstream holds its answer until the test ends: the 50 ms
// are the Transport's timer, not a sleep of the test.
func TestUpstreamHeaderTimeoutIs504(t *testing.T) {
	slow := slowUpstream(t)
	down := newUpstream(t)
	down.Close()
	prompt := newUpstream(t)

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 50 * time.Millisecond
	t.Cleanup(tr.CloseIdleConnections)
	var logs logbuf.Buffer
	reg := prometheus.NewRegistry()
	cfg := Config{Transport: tr, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	for i, tc := range []struct {
		name     string
		up       *upstream
		want     int
		wantCode string // the JSON error; "" = the upstream's answer
	}{
		{"slow", slow, http.StatusGatewayTimeout, "gateway_timeout"},
		{"down", down, http.StatusBadGateway, "bad_gateway"},
		{"prompt", prompt, http.StatusOK, ""},
	} {
		cfg := cfg
		if i > 0 {
			cfg.Registerer = nil // one gateway counts: the slow one
		}
		s := front(t, tc.up, newChecker(t), cfg)
		resp, body := requestHeader(t, http.MethodGet, s.URL+"/x", http.Header{})
		var e api.Error
		if tc.wantCode != "" {
			if err := json.Unmarshal([]byte(body), &e); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s: body %q (%v), Content-Type %q; want a JSON error", tc.name, body, err, resp.Header.Get("Content-Type"))
			}
		}
		if resp.StatusCode != tc.want || e.Code != tc.wantCode {
			t.Errorf("%s upstream: %d %q, want %d %q", tc.name, resp.StatusCode, e.Code, tc.want, tc.wantCode)
		}
	}
	if slow, down := upstreamErrors(t, reg, "504"), upstreamErrors(t, reg, "502"); slow != 1 || down != 0 {
		t.Errorf("upstream errors after a header timeout: %v (504) and %v (502), want 1 and 0", slow, down)
	}
	if !strings.Contains(logs.String(), `msg="gateway: upstream failed"`) || !strings.Contains(logs.String(), "timeout awaiting response headers") {
		t.Errorf("the header timeout is not logged as an upstream failure:\n%s", logs.String())
	}
	if slow.hits.Load() != 1 {
		t.Errorf("slow upstream saw %d requests, want 1", slow.hits.Load())
	}
}

// headerTimeout tells the Transport's response-header timeout from the
// other upstream failures, timeouts of dialing included (which stay 502).
func TestHeaderTimeoutIsTheTransportsOnly(t *testing.T) {
	slow := slowUpstream(t)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 50 * time.Millisecond
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodGet, slow.URL, nil)
	_, headerErr := tr.RoundTrip(req)

	expired, cancel := context.WithDeadline(t.Context(), time.Unix(0, 0))
	defer cancel()
	_, dialErr := (&net.Dialer{}).DialContext(expired, "tcp", "127.0.0.1:1")
	if ne, ok := dialErr.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("dial with an expired deadline: %v; want a net.Error timeout, as the case below needs", dialErr)
	}

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"response header timeout", headerErr, true},
		{"wrapped", fmt.Errorf("proxy: %w", headerErr), true},
		{"dial timeout", dialErr, false},
		{"deadline exceeded", context.DeadlineExceeded, false},
		{"canceled", context.Canceled, false},
		{"eof", io.ErrUnexpectedEOF, false},
		{"text alone", errors.New("timeout awaiting response headers"), false},
	} {
		if got := headerTimeout(tc.err); got != tc.want {
			t.Errorf("headerTimeout(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
