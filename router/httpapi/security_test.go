package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// Without an admin token, admin endpoints answer loopback callers — but
// a web page can reach loopback too. Each browser-borne shape is refused.
func TestAdminRefusesBrowserBorne(t *testing.T) {
	join := `{"id":"n2","http":"127.0.0.1:1","raft":"127.0.0.1:2","peer":"127.0.0.1:3"}`
	for _, tt := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
	}{
		{"local tool", "POST", "/v1/cluster/leave", `{"id":"n2"}`, nil, 200},
		{"local tool, localhost", "GET", "/v1/cluster/view", "", []string{"Host", "localhost:8080"}, 200},
		{"local tool, [::1]", "GET", "/v1/cluster/view", "", []string{"Host", "[::1]:8080"}, 200},
		{"local tool, yaml", "PUT", "/v1/rules", "rules: []", []string{"Content-Type", "application/yaml"}, 200},
		{"foreign Origin", "POST", "/v1/cluster/leave", `{"id":"n2"}`, []string{"Origin", "https://evil.example"}, 403},
		{"null Origin", "POST", "/v1/cluster/join", join, []string{"Origin", "null"}, 403},
		{"even a loopback Origin", "GET", "/v1/cluster/view", "", []string{"Origin", "http://127.0.0.1:8080"}, 403},
		{"text/plain write (no preflight)", "POST", "/v1/cluster/leave", `{"id":"n2"}`, []string{"Content-Type", "text/plain"}, 403},
		{"form write", "POST", "/v1/cluster/state", `{"id":"n2","state":"down"}`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 403},
		{"write without Content-Type", "PUT", "/v1/rules", `{"rules":[]}`, []string{"Content-Type", ""}, 403},
		{"DNS rebinding reads the seed", "GET", "/v1/cluster/view", "", []string{"Host", "rebind.example:8080"}, 403},
		{"DNS rebinding to 127.0.0.1.nip.io", "GET", "/v1/cluster/view", "", []string{"Host", "127.0.0.1.nip.io"}, 403},
		{"cross-site fetch metadata", "GET", "/v1/cluster/view", "", []string{"Sec-Fetch-Site", "cross-site"}, 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "")
			w := e.do(tt.method, tt.path, tt.body, tt.hdr...)
			if w.Code != tt.status {
				t.Fatalf("%s %s = %d, want %d; body %s", tt.method, tt.path, w.Code, tt.status, w.Body)
			}
			if tt.status == 403 {
				apiError(t, w, 403, api.CodeForbidden)
				if len(e.a.leaves)+len(e.a.joins) != 0 {
					t.Fatal("a refused request reached the node")
				}
			}
		})
	}
	// With a token, the token decides (a browser cannot know it).
	e := newEnv(t, "tok")
	if w := e.do("GET", "/v1/cluster/view", "", "Authorization", "Bearer tok", "Origin", "https://ops.example", "Host", "lb.example"); w.Code != 200 {
		t.Fatalf("token holder refused: %d %s", w.Code, w.Body)
	}
}

// Keys that encoding/json would turn into U+FFFD are refused, single and
// batched, instead of sharing one bucket.
func TestInvalidUTF8Keys(t *testing.T) {
	for _, body := range []string{
		"{\"rule\":\"default\",\"key\":\"t\xff\"}",
		"{\"rule\":\"default\",\"key\":\"t\xfe\"}",
		"{\"rule\":\"default\",\"key\":\"\xc3\"}",
		`{"rule":"default","key":"t\ud800"}`,
		`{"rule":"default","key":"t\udc00x"}`,
		`{"rule":"default","key":"\ud800\u0041"}`,
		"{\"checks\":[{\"rule\":\"default\",\"key\":\"ok\"},{\"rule\":\"default\",\"key\":\"t\xff\"}]}",
		`{"checks":[{"rule":"default","key":"\uDBFF"}]}`,
	} {
		e := newEnv(t, "")
		got := apiError(t, e.do("POST", "/v1/check", body), 400, api.CodeBadRequest)
		if !strings.Contains(got.Message, "UTF-8") {
			t.Errorf("%q: message %q does not say UTF-8", body, got.Message)
		}
	}
	for _, body := range []string{
		`{"rule":"default","key":"\ud83d\ude00"}`,
		`{"rule":"default","key":"\uFFFD"}`,
		"{\"rule\":\"default\",\"key\":\"caf\u00e9 \U0001F600\"}",
		`{"checks":[{"rule":"default","key":"a\\u\"b"}]}`,
	} {
		e := newEnv(t, "")
		if w := e.do("POST", "/v1/check", body); w.Code != 200 {
			t.Errorf("%q = %d %s, want 200", body, w.Code, w.Body)
		}
	}
}

// FuzzInvalidJSONString: when invalidJSONString accepts a JSON string,
// encoding/json decodes it without inventing a U+FFFD (every U+FFFD of
// the result was in the input, raw or as \ufffd).
func FuzzInvalidJSONString(f *testing.F) {
	for _, s := range []string{`abc`, `\ud800`, `\ud83d\ude00`, `\udc00`, "\xff", `\ufffd`, "\uFFFD", `\\ud800`, `\ud800\\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		doc := []byte(`"` + raw + `"`)
		var s string
		if json.Unmarshal(doc, &s) != nil {
			return // not a JSON string: the decoder refuses it first
		}
		if invalidJSONString([]byte(raw)) != "" {
			return
		}
		want := strings.Count(raw, "\uFFFD") + strings.Count(strings.ToLower(raw), `\ufffd`) -
			strings.Count(strings.ToLower(raw), `\\ufffd`)
		if got := strings.Count(s, "\uFFFD"); got > want || !utf8.ValidString(s) {
			t.Fatalf("accepted %q, which decodes to %q with %d U+FFFD (input had %d)", raw, s, got, want)
		}
	})
}
