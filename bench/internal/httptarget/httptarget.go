// Package httptarget is the HTTP/JSON client style the benchmark
// commands share: the body appended by hand, the answer scanned for what
// the load loop counts (encoding/json when the scan does not recognise
// it), one keep-alive connection per worker and server.
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
// plain ASCII, which strconv quotes exactly as JSON does. A string with
// nothing to escape (the bench's every key) is copied between quotes.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Post posts body to url and hands a 200 answer to read; the answer's
// bytes are reused once read returns.
func Post(ctx context.Context, hc *http.Client, url string, body []byte, read func(answer []byte) error) error {
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
	return read(buf.Bytes())
}

// Ringlimit is POST /v1/check on one member: the single form for one
// check, the batch form for more. The answer is read into ds.
func Ringlimit(hc *http.Client, addr string) loadgen.CheckFunc {
	url := "http://" + addr + "/v1/check"
	return func(ctx context.Context, checks []api.CheckRequest, ds []api.Decision) (int, error) {
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
			b = one(b, checks[0])
		} else {
			b = append(b, `{"checks":[`...)
			for i, c := range checks {
				if i > 0 {
					b = append(b, ',')
				}
				b = one(b, c)
			}
			b = append(b, "]}"...)
		}
		err := Post(ctx, hc, url, b, func(answer []byte) error {
			if ScanRinglimit(answer, ds) {
				return nil
			}
			return decodeRinglimit(answer, ds)
		})
		if err != nil {
			return 0, err
		}
		return len(ds), nil
	}
}

// decodeRinglimit decodes a ringlimit answer for len(ds) checks into ds
// with encoding/json: the path of an answer ScanRinglimit does not know.
func decodeRinglimit(answer []byte, ds []api.Decision) error {
	if len(ds) == 1 {
		return json.Unmarshal(answer, &ds[0])
	}
	var r api.BatchResponse
	if err := json.Unmarshal(answer, &r); err != nil {
		return err
	}
	if len(r.Results) != len(ds) {
		return fmt.Errorf("%d results for %d checks", len(r.Results), len(ds))
	}
	copy(ds, r.Results)
	return nil
}

// CostOf is a check's cost, 1 when it names none.
func CostOf(c api.CheckRequest) int64 {
	if c.Cost == nil {
		return 1
	}
	return *c.Cost
}
