// Package client is the Go client of ringlimit's HTTP API (see the
// "HTTP API" and "Go client" sections of the repository's README.md):
// checks, rules, cluster membership and readiness.
//
// A Client talks to one node; any node answers any check. A Client is safe
// for concurrent use by many goroutines and keeps connections alive between
// calls, so create one per node and reuse it. Every method takes a context
// first; its deadline or cancellation bounds the whole call (the Client sets
// no timeout of its own).
//
// Every answer outside 2xx is returned as a *api.Error whose Status is the
// HTTP status; use errors.As to read its Code. Transport failures are
// returned wrapped, so errors.Is(err, context.Canceled) and friends work.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/api"
)

// maxResponse bounds how much of a response body is read: a full batch
// answer is ~150 KiB, so this only stops a misbehaving peer.
const maxResponse = 16 << 20

// maxErrorText bounds the message taken from an error body that is not
// the contract's JSON.
const maxErrorText = 512

// Client calls one ringlimit node over HTTP. The zero value is not usable;
// call New.
type Client struct {
	base       string // "http://host:port", no trailing slash
	hc         *http.Client
	adminToken string
	forwarded  bool // mark admin requests with api.HeaderForwarded
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc (for its
// transport, TLS settings or timeout) instead of its own keep-alive client.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithAdminToken sets the bearer token sent to the admin endpoints
// (PutRules, Join, Leave).
func WithAdminToken(token string) Option {
	return func(c *Client) { c.adminToken = token }
}

// AsForwarder marks the Client's admin requests as forwarded by a node to
// its leader (api.HeaderForwarded), so the receiver does not forward them
// again. Nodes use it; people and tools do not.
func AsForwarder() Option {
	return func(c *Client) { c.forwarded = true }
}

// New returns a Client for the node at addr, given as host:port or as a
// URL (http://host:port). Unless WithHTTPClient is given, the Client owns a
// transport that keeps up to 256 idle connections to the node.
func New(addr string, opts ...Option) *Client {
	c := &Client{base: BaseURL(addr)}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: NewTransport(256)}
	}
	return c
}

// NewTransport returns an HTTP transport for talking to ringlimit nodes
// that keeps up to maxIdlePerHost idle connections to each of them, so that
// that many concurrent callers reuse their connections instead of dialing.
// Share one between Clients (through WithHTTPClient) to pool connections
// across nodes.
func NewTransport(maxIdlePerHost int) *http.Transport {
	if maxIdlePerHost < 2 {
		maxIdlePerHost = 2
	}
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          4 * maxIdlePerHost,
		MaxIdleConnsPerHost:   maxIdlePerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// BaseURL turns "host:port" or "http(s)://host:port[/]" into a URL without
// a trailing slash.
func BaseURL(addr string) string {
	addr = strings.TrimRight(strings.TrimSpace(addr), "/")
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return addr
	}
	return "http://" + addr
}

// Addr is the base URL the Client sends to.
func (c *Client) Addr() string { return c.base }

// CloseIdleConnections closes the idle keep-alive connections of the
// Client's HTTP client.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Check spends cost units of rule for key and returns the decision. Cost 0
// is a query that spends nothing. A denied check is a Decision with Allowed
// false, not an error.
func (c *Client) Check(ctx context.Context, rule, key string, cost int64) (api.Decision, error) {
	var d api.Decision
	body := appendCheck(make([]byte, 0, len(rule)+len(key)+48), rule, key, cost)
	err := c.send(ctx, http.MethodPost, "/v1/check", false, bytes.NewReader(body), "application/json", func(data []byte) error {
		if parseDecision(data, &d) {
			return nil
		}
		return json.Unmarshal(data, &d)
	})
	return d, err
}

// CheckBatch decides checks one by one, in one request, and returns the
// decisions in the same order. At most api.MaxBatch checks fit in one
// call; a batch with an invalid entry is rejected whole (nothing spent).
// An empty batch returns no decisions without a request.
func (c *Client) CheckBatch(ctx context.Context, checks []api.CheckRequest) ([]api.Decision, error) {
	if len(checks) == 0 {
		return []api.Decision{}, nil
	}
	var resp api.BatchResponse
	body := appendBatch(make([]byte, 0, bodySize(checks)), checks)
	err := c.send(ctx, http.MethodPost, "/v1/check", false, bytes.NewReader(body), "application/json", func(data []byte) error {
		if ds, ok := parseResults(data, len(checks)); ok {
			resp.Results = ds
			return nil
		}
		return json.Unmarshal(data, &resp)
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != len(checks) {
		return nil, fmt.Errorf("client: POST /v1/check: %d results for %d checks", len(resp.Results), len(checks))
	}
	return resp.Results, nil
}

// Rules returns the cluster's rule set, the default rule first.
func (c *Client) Rules(ctx context.Context) ([]api.Rule, error) {
	var rs api.Rules
	if err := c.do(ctx, http.MethodGet, "/v1/rules", false, nil, &rs); err != nil {
		return nil, err
	}
	return rs.Rules, nil
}

// PutRules replaces the written rules with doc, a rules document in
// contentType ("application/json" or "application/yaml"; empty means
// JSON), and returns the new set. It is an admin call.
func (c *Client) PutRules(ctx context.Context, doc []byte, contentType string) ([]api.Rule, error) {
	rs, err := c.PutRulesAnswer(ctx, doc, contentType)
	return rs.Rules, err
}

// PutRulesAnswer is PutRules returning the whole answer: the rules in
// force and the rules version (api.Rules.RulesVersion; 0 from a member
// of an earlier release).
func (c *Client) PutRulesAnswer(ctx context.Context, doc []byte, contentType string) (api.Rules, error) {
	if contentType == "" {
		contentType = "application/json"
	}
	var rs api.Rules
	if err := c.send(ctx, http.MethodPut, "/v1/rules", true, bytes.NewReader(doc), contentType, jsonInto(&rs)); err != nil {
		return api.Rules{}, err
	}
	return rs, nil
}

// Cluster returns the membership: leader, epoch, partitions and members.
func (c *Client) Cluster(ctx context.Context) (api.Cluster, error) {
	var cl api.Cluster
	err := c.do(ctx, http.MethodGet, "/v1/cluster", false, nil, &cl)
	return cl, err
}

// Join adds a member to the cluster. It is an admin call.
func (c *Client) Join(ctx context.Context, req api.JoinRequest) error {
	_, err := c.JoinEpoch(ctx, req)
	return err
}

// JoinEpoch is Join, and returns the epoch of the answer: the Raft index
// from which the cluster lists the member as req asks
// (api.JoinResponse.Epoch), 0 when the member that answered does not say
// (a version older than the field, or an answer with no body at all).
func (c *Client) JoinEpoch(ctx context.Context, req api.JoinRequest) (uint64, error) {
	var out api.JoinResponse
	if err := c.do(ctx, http.MethodPost, "/v1/cluster/join", true, req, maybeEmpty{&out}); err != nil {
		return 0, err
	}
	return out.Epoch, nil
}

// maybeEmpty is an answer (v) that a 2xx response may leave out: an
// empty body leaves v as it is.
type maybeEmpty struct{ v any }

// Leave drains the member id and removes it from the cluster for good. It
// is an admin call.
func (c *Client) Leave(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/v1/cluster/leave", true, api.LeaveRequest{ID: id}, nil)
}

// RouterView returns what a router that is not a member needs to route
// checks itself (GET /v1/cluster/view; admin, as it carries the seed).
func (c *Client) RouterView(ctx context.Context) (api.ClusterView, error) {
	var v api.ClusterView
	err := c.do(ctx, http.MethodGet, "/v1/cluster/view", true, nil, &v)
	return v, err
}

// Seed asks a member whether it holds a cluster's Raft state
// (GET /v1/cluster/seed): what a seed with no Raft state asks the other
// members of its --join list before it bootstraps.
func (c *Client) Seed(ctx context.Context) (api.SeedStatus, error) {
	var s api.SeedStatus
	err := c.do(ctx, http.MethodGet, "/v1/cluster/seed", false, nil, &s)
	return s, err
}

// SetState marks member id "down" (stopped gracefully) or "active".
func (c *Client) SetState(ctx context.Context, id, state string) error {
	return c.do(ctx, http.MethodPost, "/v1/cluster/state", true, api.StateRequest{ID: id, State: state}, nil)
}

// Ready returns nil when the node is ready (GET /readyz answers 2xx): in a
// cluster with a leader, with its partitions received.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", false, nil, nil)
}

// do sends in (if not nil) as JSON and decodes a 2xx answer into out (if
// not nil).
func (c *Client) do(ctx context.Context, method, path string, admin bool, in, out any) error {
	var body io.Reader
	contentType := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: %s %s: %w", method, path, err)
		}
		body, contentType = bytes.NewReader(b), "application/json"
	}
	return c.send(ctx, method, path, admin, body, contentType, jsonInto(out))
}

// jsonInto returns the decoder of a JSON answer into out (nil for none:
// the answer's body is not read as JSON).
func jsonInto(out any) func([]byte) error {
	if out == nil {
		return nil
	}
	return func(data []byte) error {
		if m, ok := out.(maybeEmpty); ok {
			if len(bytes.TrimSpace(data)) == 0 {
				return nil
			}
			return json.Unmarshal(data, m.v)
		}
		return json.Unmarshal(data, out)
	}
}

// send sends a request and hands a 2xx answer's body to decode (if not
// nil), whose error is the call's; the body is only valid during decode.
func (c *Client) send(ctx context.Context, method, path string, admin bool, body io.Reader, contentType string, decode func([]byte) error) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if admin && c.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
	}
	if admin && c.forwarded {
		req.Header.Set(api.HeaderForwarded, "1")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// Name the URL once: *url.Error would repeat it.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return fmt.Errorf("client: %s %s%s: %w", method, c.base, path, err)
	}
	defer resp.Body.Close()
	buf := bodies.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= maxPooledBody {
			bodies.Put(buf)
		}
	}()
	data, err := readBody(resp.Body, buf, resp.ContentLength, maxResponse)
	if err != nil {
		return fmt.Errorf("client: %s %s: reading response: %w", method, path, err)
	}
	if len(data) > maxResponse {
		return fmt.Errorf("client: %s %s: response over %d bytes", method, path, maxResponse)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp.StatusCode, data)
	}
	if decode == nil {
		return nil
	}
	if err := decode(data); err != nil {
		return fmt.Errorf("client: %s %s: decoding response: %w", method, path, err)
	}
	return nil
}

// decodeError turns a non-2xx answer into a *api.Error: the contract's
// JSON body when there is one, else code "http_<status>" and the start of
// the body as message.
func decodeError(status int, body []byte) *api.Error {
	var e api.Error
	if json.Unmarshal(body, &e) == nil && e.Code != "" {
		e.Status = status
		return &e
	}
	msg := strings.ToValidUTF8(strings.TrimSpace(string(body)), "\uFFFD")
	if len(msg) > maxErrorText {
		cut := maxErrorText
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &api.Error{Status: status, Code: "http_" + strconv.Itoa(status), Message: msg}
}
