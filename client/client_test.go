package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// recorded is what the fake server saw of one request.
type recorded struct {
	method, path, contentType, auth string
	body                            []byte
}

// fake starts a server whose handler records the request and answers with
// status and body.
func fake(t *testing.T, status int, body string) (*httptest.Server, *recorded) {
	t.Helper()
	rec := &recorded{}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		*rec = recorded{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), b}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, rec
}

func TestNewAddressForms(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080"},
		{" https://n1.example:443 ", "https://n1.example:443"},
	} {
		if got := New(tc.in).Addr(); got != tc.want {
			t.Errorf("New(%q).Addr() = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	srv, rec := fake(t, 200, `{"allowed":true,"limit":200,"remaining":199,"reset_after_ms":10,"retry_after_ms":0,"delay_ms":0,"degraded":false}`)
	// host:port form, as the CLI passes it.
	c := New(strings.TrimPrefix(srv.URL, "http://"), WithAdminToken("secret"))
	d, err := c.Check(context.Background(), "public-api", "tenant-42", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := api.Decision{Allowed: true, Limit: 200, Remaining: 199, ResetAfterMs: 10}
	if d != want {
		t.Errorf("Check = %+v, want %+v", d, want)
	}
	if rec.method != "POST" || rec.path != "/v1/check" || rec.contentType != "application/json" {
		t.Errorf("request = %s %s (%s)", rec.method, rec.path, rec.contentType)
	}
	if rec.auth != "" {
		t.Errorf("check sent Authorization %q; the admin token is for admin calls only", rec.auth)
	}
	// cost 0 is a query and must be sent, not omitted (omitted means 1).
	if got := string(rec.body); got != `{"rule":"public-api","key":"tenant-42","cost":0}` {
		t.Errorf("body = %s", got)
	}
}

func TestCheckBatch(t *testing.T) {
	srv, rec := fake(t, 200, `{"results":[{"allowed":true,"limit":5,"remaining":4},{"allowed":false,"limit":5,"retry_after_ms":100}]}`)
	c := New(srv.URL)
	one := int64(1)
	ds, err := c.CheckBatch(context.Background(), []api.CheckRequest{{Rule: "r", Key: "a", Cost: &one}, {Rule: "r", Key: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Decision{{Allowed: true, Limit: 5, Remaining: 4}, {Limit: 5, RetryAfterMs: 100}}
	if !reflect.DeepEqual(ds, want) {
		t.Errorf("CheckBatch = %+v, want %+v", ds, want)
	}
	if got := string(rec.body); got != `{"checks":[{"rule":"r","key":"a","cost":1},{"rule":"r","key":"b"}]}` {
		t.Errorf("body = %s", got)
	}

	// An answer with the wrong number of results is an error, not a
	// silently misaligned slice.
	if _, err := c.CheckBatch(context.Background(), []api.CheckRequest{{Rule: "r", Key: "a"}}); err == nil {
		t.Error("CheckBatch with 2 results for 1 check: nil error")
	}

	ds, err = c.CheckBatch(context.Background(), nil)
	if err != nil || len(ds) != 0 {
		t.Errorf("CheckBatch(nil) = %v, %v; want empty, nil", ds, err)
	}
}

func TestRulesAndPutRules(t *testing.T) {
	body := `{"rules":[{"name":"default","algorithm":"token_bucket","limit":100,"period":"1s","burst":200,"failure_mode":"open"}]}`
	want := []api.Rule{{Name: "default", Algorithm: "token_bucket", Limit: 100, Period: "1s", Burst: 200, FailureMode: "open"}}
	srv, rec := fake(t, 200, body)
	c := New(srv.URL, WithAdminToken("secret"))

	rs, err := c.Rules(context.Background())
	if err != nil || !reflect.DeepEqual(rs, want) {
		t.Fatalf("Rules = %+v, %v; want %+v", rs, err, want)
	}
	if rec.method != "GET" || rec.path != "/v1/rules" {
		t.Errorf("request = %s %s", rec.method, rec.path)
	}

	doc := []byte("rules:\n  - name: x\n")
	rs, err = c.PutRules(context.Background(), doc, "application/yaml")
	if err != nil || !reflect.DeepEqual(rs, want) {
		t.Fatalf("PutRules = %+v, %v", rs, err)
	}
	if rec.method != "PUT" || rec.path != "/v1/rules" || rec.contentType != "application/yaml" ||
		rec.auth != "Bearer secret" || string(rec.body) != string(doc) {
		t.Errorf("request = %+v", *rec)
	}
	if _, err := c.PutRules(context.Background(), []byte(`{}`), ""); err != nil || rec.contentType != "application/json" {
		t.Errorf("PutRules with empty content type: %v, sent %q", err, rec.contentType)
	}
}

func TestClusterJoinLeaveReady(t *testing.T) {
	body := `{"leader":"n1","epoch":42,"partitions":1024,"members":[{"id":"n1","state":"active","http":"127.0.0.1:8080","raft":"127.0.0.1:8081","peer":"127.0.0.1:8082","partitions":341}]}`
	srv, rec := fake(t, 200, body)
	c := New(srv.URL, WithAdminToken("tok"))
	ctx := context.Background()

	cl, err := c.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := api.Cluster{Leader: "n1", Epoch: 42, Partitions: 1024, Members: []api.Member{
		{ID: "n1", State: "active", HTTP: "127.0.0.1:8080", Raft: "127.0.0.1:8081", Peer: "127.0.0.1:8082", Partitions: 341}}}
	if !reflect.DeepEqual(cl, want) {
		t.Errorf("Cluster = %+v", cl)
	}

	if err := c.Join(ctx, api.JoinRequest{ID: "n2", HTTP: "h", Raft: "r", Peer: "p"}); err != nil {
		t.Fatal(err)
	}
	if rec.method != "POST" || rec.path != "/v1/cluster/join" || rec.auth != "Bearer tok" ||
		string(rec.body) != `{"id":"n2","http":"h","raft":"r","peer":"p"}` {
		t.Errorf("join request = %+v", *rec)
	}

	if err := c.Leave(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	if rec.method != "POST" || rec.path != "/v1/cluster/leave" || rec.auth != "Bearer tok" || string(rec.body) != `{"id":"n2"}` {
		t.Errorf("leave request = %+v", *rec)
	}

	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if rec.method != "GET" || rec.path != "/readyz" {
		t.Errorf("ready request = %s %s", rec.method, rec.path)
	}
}

// JoinEpoch returns the epoch of a join's answer, and 0 from a member
// that does not give one: the {"status":"ok"} of members older than the
// field, or no body at all.
func TestJoinEpoch(t *testing.T) {
	for _, tc := range []struct {
		body string
		want uint64
	}{
		{`{"status":"ok","epoch":12}`, 12},
		{`{"status":"ok"}`, 0},
		{``, 0},
		{"\n", 0},
	} {
		srv, rec := fake(t, 200, tc.body)
		got, err := New(srv.URL).JoinEpoch(context.Background(), api.JoinRequest{ID: "n2", HTTP: "h", Raft: "r", Peer: "p"})
		if err != nil || got != tc.want {
			t.Errorf("JoinEpoch answered %q = %d, %v; want %d", tc.body, got, err, tc.want)
		}
		if rec.method != "POST" || rec.path != "/v1/cluster/join" || string(rec.body) != `{"id":"n2","http":"h","raft":"r","peer":"p"}` {
			t.Errorf("join request = %+v", *rec)
		}
	}
	srv, _ := fake(t, 200, `{"status":"ok","epoch":`)
	if _, err := New(srv.URL).JoinEpoch(context.Background(), api.JoinRequest{ID: "n2", HTTP: "h", Raft: "r", Peer: "p"}); err == nil {
		t.Error("JoinEpoch took a truncated answer")
	}
}

// TestErrors runs every call against every error shape of the contract.
func TestErrors(t *testing.T) {
	calls := map[string]func(*Client) error{
		"Check": func(c *Client) error { _, err := c.Check(context.Background(), "r", "k", 1); return err },
		"CheckBatch": func(c *Client) error {
			_, err := c.CheckBatch(context.Background(), []api.CheckRequest{{Rule: "r", Key: "k"}})
			return err
		},
		"Rules":    func(c *Client) error { _, err := c.Rules(context.Background()); return err },
		"PutRules": func(c *Client) error { _, err := c.PutRules(context.Background(), []byte("{}"), ""); return err },
		"Cluster":  func(c *Client) error { _, err := c.Cluster(context.Background()); return err },
		"Join":     func(c *Client) error { return c.Join(context.Background(), api.JoinRequest{ID: "x"}) },
		"Leave":    func(c *Client) error { return c.Leave(context.Background(), "x") },
		"Ready":    func(c *Client) error { return c.Ready(context.Background()) },
	}
	shapes := []struct {
		status int
		code   string
	}{
		{400, api.CodeBadRequest},
		{400, api.CodeInvalidRules},
		{401, api.CodeUnauthorized},
		{403, api.CodeForbidden},
		{404, api.CodeUnknownRule},
		{413, api.CodeTooLarge},
		{503, api.CodeUnavailable},
	}
	for _, sh := range shapes {
		srv, _ := fake(t, sh.status, `{"error":"`+sh.code+`","message":"checks[3]: something"}`)
		c := New(srv.URL)
		for name, call := range calls {
			err := call(c)
			var e *api.Error
			if !errors.As(err, &e) {
				t.Errorf("%s against %d %s: error %v (%T), want *api.Error", name, sh.status, sh.code, err, err)
				continue
			}
			want := api.Error{Status: sh.status, Code: sh.code, Message: "checks[3]: something"}
			if *e != want {
				t.Errorf("%s against %d %s: %+v, want %+v", name, sh.status, sh.code, *e, want)
			}
		}
	}
}

func TestNonJSONErrorBody(t *testing.T) {
	long := strings.Repeat("é", 1000) // 2000 bytes, multi-byte runes
	for _, tc := range []struct {
		name, body, wantMsg string
		status              int
	}{
		{"text", "upstream exploded\n", "upstream exploded", 502},
		{"empty", "", "Service Unavailable", 503},
		{"json without code", `{"detail":"x"}`, `{"detail":"x"}`, 500},
		{"long", long, "", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := fake(t, tc.status, tc.body)
			_, err := New(srv.URL).Check(context.Background(), "r", "k", 1)
			var e *api.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want *api.Error", err, err)
			}
			if wantCode := "http_" + itoa(tc.status); e.Status != tc.status || e.Code != wantCode {
				t.Errorf("error = %+v, want status %d code %s", *e, tc.status, wantCode)
			}
			if tc.wantMsg != "" && e.Message != tc.wantMsg {
				t.Errorf("message = %q, want %q", e.Message, tc.wantMsg)
			}
			if len(e.Message) > maxErrorText+len("…") || !utf8.ValidString(e.Message) {
				t.Errorf("message not truncated to valid UTF-8: %d bytes, valid %v", len(e.Message), utf8.ValidString(e.Message))
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestBadSuccessBody(t *testing.T) {
	srv, _ := fake(t, 200, `not json`)
	_, err := New(srv.URL).Check(context.Background(), "r", "k", 1)
	var e *api.Error
	if err == nil || errors.As(err, &e) {
		t.Errorf("Check with a 200 non-JSON body: %v; want a decode error", err)
	}
}

func TestContextCancel(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so the server notices the client hanging up
		close(entered)
		select { // hold the request until the client gives up
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	c := New(srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-entered
		cancel()
	}()
	_, err := c.Check(ctx, "r", "k", 1)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Check after cancel: %v, want context.Canceled", err)
	}
	if want := "client: POST " + srv.URL + "/v1/check: context canceled"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

func TestTransportError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	if _, err := New(addr).Cluster(context.Background()); err == nil {
		t.Fatal("Cluster against a closed port: nil error")
	}
}

// TestKeepAlive checks that sequential calls reuse one connection.
func TestKeepAlive(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"allowed":true}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := New(srv.URL)
	defer c.CloseIdleConnections()
	for range 50 {
		if _, err := c.Check(context.Background(), "r", "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("50 sequential checks opened %d connections, want 1", n)
	}
}

func TestWithHTTPClient(t *testing.T) {
	var used atomic.Bool
	srv, _ := fake(t, 200, `{"allowed":true}`)
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		used.Store(true)
		return http.DefaultTransport.RoundTrip(r)
	})}
	if _, err := New(srv.URL, WithHTTPClient(hc)).Check(context.Background(), "r", "k", 1); err != nil {
		t.Fatal(err)
	}
	if !used.Load() {
		t.Error("WithHTTPClient: the given client was not used")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A forwarding node marks its admin requests; ordinary clients and
// non-admin requests carry no mark.
func TestAsForwarderMarksAdminRequests(t *testing.T) {
	seen := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.Path + "=" + r.Header.Get(api.HeaderForwarded)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok","leader":"","epoch":0,"partitions":0,"members":[]}`)
	}))
	defer srv.Close()
	ctx := context.Background()
	fwd, plain := New(srv.URL, AsForwarder()), New(srv.URL)
	_ = fwd.Leave(ctx, "n2")
	_, _ = fwd.Cluster(ctx)
	_ = plain.Leave(ctx, "n2")
	for _, want := range []string{"/v1/cluster/leave=1", "/v1/cluster=", "/v1/cluster/leave="} {
		if got := <-seen; got != want {
			t.Errorf("request %s, want %s", got, want)
		}
	}
}
