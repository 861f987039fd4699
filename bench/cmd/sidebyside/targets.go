package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/gubernator-io/gubernator/v2"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/bench/internal/httptarget"
	"github.com/ringlimit/ringlimit/bench/internal/resp"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/loadgen"
	"github.com/ringlimit/ringlimit/router"
)

// The HTTP/JSON targets (ringlimit's POST /v1/check, gubernator's
// POST /v1/GetRateLimits) share one client style: the body appended by
// hand into a pooled buffer, the answer decoded with encoding/json into
// a small struct, one keep-alive connection per worker and server.

// ringlimitRing is the Go client on the data plane: Ring.Check for one
// check per call (concurrent calls share frames per owner), the Ring's
// router for a batch per call. The router's requests and results of a
// call are reused from a pool (per worker, in effect), as a caller
// deciding batches in a loop would keep them.
func ringlimitRing(rc *client.Ring) loadgen.CheckFunc {
	type buffers struct {
		reqs []router.Request
		out  []router.Result
	}
	pool := sync.Pool{New: func() any { return new(buffers) }}
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		if len(checks) == 1 {
			d, err := rc.Check(ctx, checks[0].Rule, checks[0].Key, httptarget.CostOf(checks[0]))
			if err != nil {
				return 0, err
			}
			ds[0] = d
			return 1, nil
		}
		buf := pool.Get().(*buffers)
		defer pool.Put(buf)
		reqs := slices.Grow(buf.reqs[:0], len(checks))[:len(checks)]
		for i, c := range checks {
			reqs[i] = router.Request{Rule: c.Rule, Key: c.Key, Cost: httptarget.CostOf(c)}
		}
		out := slices.Grow(buf.out[:0], len(reqs))[:len(reqs)]
		buf.reqs, buf.out = reqs, out
		if err := rc.Router().Check(ctx, reqs, out); err != nil {
			return 0, err
		}
		for i, r := range out {
			ds[i] = api.Decision{Allowed: r.Allowed, Remaining: r.Remaining, Degraded: r.Degraded}
		}
		return len(out), nil
	}
}

// gubRule is the gubernator form of the bench rule: a token bucket of
// limit per duration (its burst is the limit).
type gubRule struct {
	limit, durationMs int64
}

// gubResponse is what the checks read of gubernator's HTTP answer
// (grpc-gateway JSON with proto names; status is an enum name).
type gubResponse struct {
	Responses []struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	} `json:"responses"`
}

// gubernatorHTTP is POST /v1/GetRateLimits on one instance's HTTP gateway.
func gubernatorHTTP(hc *http.Client, addr string, r gubRule) loadgen.CheckFunc {
	url := "http://" + addr + "/v1/GetRateLimits"
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		b := make([]byte, 0, 120*len(checks)+16)
		b = append(b, `{"requests":[`...)
		for i, c := range checks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"name":`...)
			b = httptarget.AppendString(b, c.Rule)
			b = append(b, `,"unique_key":`...)
			b = httptarget.AppendString(b, c.Key)
			b = append(b, `,"hits":`...)
			b = strconv.AppendInt(b, httptarget.CostOf(c), 10)
			b = append(b, `,"limit":`...)
			b = strconv.AppendInt(b, r.limit, 10)
			b = append(b, `,"duration":`...)
			b = strconv.AppendInt(b, r.durationMs, 10)
			b = append(b, `,"algorithm":"TOKEN_BUCKET"}`...)
		}
		b = append(b, "]}"...)
		err := httptarget.Post(ctx, hc, url, b, func(answer []byte) error {
			if httptarget.ScanGubernator(answer, ds) {
				return nil
			}
			var resp gubResponse
			if err := json.Unmarshal(answer, &resp); err != nil {
				return err
			}
			if len(resp.Responses) != len(ds) {
				return fmt.Errorf("gubernator: %d responses for %d requests", len(resp.Responses), len(ds))
			}
			for i, x := range resp.Responses {
				if x.Error != "" {
					return errors.New("gubernator: " + x.Error)
				}
				ds[i].Allowed = x.Status != "OVER_LIMIT"
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		return len(ds), nil
	}
}

// gubernatorGRPC is V1.GetRateLimits over gRPC on one instance.
func gubernatorGRPC(c gubernator.V1Client, r gubRule) loadgen.CheckFunc {
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		req := &gubernator.GetRateLimitsReq{Requests: make([]*gubernator.RateLimitReq, len(checks))}
		for i, ch := range checks {
			req.Requests[i] = &gubernator.RateLimitReq{Name: ch.Rule, UniqueKey: ch.Key, Hits: httptarget.CostOf(ch),
				Limit: r.limit, Duration: r.durationMs, Algorithm: gubernator.Algorithm_TOKEN_BUCKET}
		}
		resp, err := c.GetRateLimits(ctx, req)
		if err != nil {
			return 0, err
		}
		if len(resp.Responses) != len(ds) {
			return len(resp.Responses), nil
		}
		for i, x := range resp.Responses {
			if x.Error != "" {
				return 0, errors.New("gubernator: " + x.Error)
			}
			ds[i] = api.Decision{Allowed: x.Status == gubernator.Status_UNDER_LIMIT, Limit: x.Limit, Remaining: x.Remaining}
		}
		return len(ds), nil
	}
}

// tokenBucketLua is the classic atomic Redis token bucket: one script
// reads the hash {tokens, ts}, refills by the time passed on Redis's
// clock, spends one token if it can, writes the hash back and sets its
// expiry. ARGV[1] is tokens per millisecond, ARGV[2] the burst.
const tokenBucketLua = `local t = redis.call("TIME")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local b = redis.call("HMGET", KEYS[1], "tokens", "ts")
local burst = tonumber(ARGV[2])
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - ts) * tonumber(ARGV[1]))
local allowed = 0
if tokens >= 1 then tokens = tokens - 1; allowed = 1 end
redis.call("HSET", KEYS[1], "tokens", tokens, "ts", now)
redis.call("PEXPIRE", KEYS[1], 60000)
return allowed`

// redisEvalsha runs the token bucket script once per check: one call's
// checks are pipelined (written together, then every reply read), so a
// call of one check is unpipelined and a call of 16 is pipeline 16.
func redisEvalsha(p *resp.Pool, sha, perMs, burst string) loadgen.CheckFunc {
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
		err := p.Pipeline(ctx, func(rc *resp.Conn) {
			for _, c := range checks {
				rc.AppendCmd("EVALSHA", sha, "1", c.Key, perMs, burst)
			}
		}, len(checks), func(i int, n int64, _ string) { ds[i].Allowed = n == 1 })
		if err != nil {
			return 0, err
		}
		return len(checks), nil
	}
}
