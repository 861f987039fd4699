// Package httptarget is the HTTP/JSON client style the benchmark
// commands share: the body appended by hand, the answer decoded with
// encoding/json into a small struct, one keep-alive connection per worker
// and server.
package httptarget

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/internal/loadgen"
)

// BufPool holds answer buffers.
var BufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// AppendString appends s as a JSON string; bench keys and rule names are
// plain ASCII, which strconv quotes exactly as JSON does.
func AppendString(b []byte, s string) []byte { return strconv.AppendQuote(b, s) }

// PostJSON posts body to url and decodes a 200 answer into out.
func PostJSON(ctx context.Context, hc *http.Client, url string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := BufPool.Get().(*bytes.Buffer)
	defer BufPool.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, 4<<20)); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %.200s", url, resp.StatusCode, buf.Bytes())
	}
	return json.Unmarshal(buf.Bytes(), out)
}

// Ringlimit is POST /v1/check on one member: the single form for one
// check, the batch form for more.
func Ringlimit(hc *http.Client, addr string) loadgen.CheckFunc {
	url := "http://" + addr + "/v1/check"
	return func(ctx context.Context, checks []api.CheckRequest) ([]api.Decision, error) {
		b := make([]byte, 0, 64*len(checks)+16)
		one := func(b []byte, c api.CheckRequest) []byte {
			b = append(b, `{"rule":`...)
			b = AppendString(b, c.Rule)
			b = append(b, `,"key":`...)
			b = AppendString(b, c.Key)
			b = append(b, `,"cost":`...)
			b = strconv.AppendInt(b, CostOf(c), 10)
			return append(b, '}')
		}
		if len(checks) == 1 {
			var d api.Decision
			if err := PostJSON(ctx, hc, url, one(b, checks[0]), &d); err != nil {
				return nil, err
			}
			return []api.Decision{d}, nil
		}
		b = append(b, `{"checks":[`...)
		for i, c := range checks {
			if i > 0 {
				b = append(b, ',')
			}
			b = one(b, c)
		}
		b = append(b, "]}"...)
		var r api.BatchResponse
		if err := PostJSON(ctx, hc, url, b, &r); err != nil {
			return nil, err
		}
		return r.Results, nil
	}
}

func CostOf(c api.CheckRequest) int64 {
	if c.Cost == nil {
		return 1
	}
	return *c.Cost
}
