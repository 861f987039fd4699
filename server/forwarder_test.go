package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ringlimit/ringlimit/api"
)

// The forwarder carries a join's epoch back from the member it asked,
// marked forwarded to a leader (Join) and not through a member (JoinVia);
// a member older than the epoch answers without one, which reads 0, and
// a refusal keeps its meaning (a live holder of the id, and a member that
// left, both 409, stay apart).
func TestForwarderJoinAnswers(t *testing.T) {
	var answer string
	var status int
	var forwarded []bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		forwarded = append(forwarded, r.Header.Get(api.HeaderForwarded) != "")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	f := newForwarder("")
	req := api.JoinRequest{ID: "n3", HTTP: "h:1", Raft: "h:2", Peer: "h:3"}
	for _, tc := range []struct {
		status  int
		answer  string
		epoch   uint64
		wantErr error
	}{
		{200, `{"status":"ok","epoch":17}`, 17, nil},
		{200, `{"status":"ok"}`, 0, nil},
		{503, `{"error":"unavailable","message":"no leader"}`, 0, api.ErrUnavailable},
		{409, `{"error":"conflict","message":"member \"n3\" is live"}`, 0, api.ErrConflict},
		{409, `{"error":"left","message":"member \"n3\" left the cluster"}`, 0, api.ErrLeft},
	} {
		status, answer = tc.status, tc.answer
		for _, via := range []struct {
			name      string
			join      func(context.Context, string, api.JoinRequest) (uint64, error)
			forwarded bool
		}{{"Join", f.Join, true}, {"JoinVia", f.JoinVia, false}} {
			forwarded = nil
			epoch, err := via.join(context.Background(), srv.Listener.Addr().String(), req)
			if epoch != tc.epoch || !errors.Is(err, tc.wantErr) || tc.wantErr == nil && err != nil ||
				tc.wantErr == api.ErrConflict && errors.Is(err, api.ErrLeft) || tc.wantErr == api.ErrLeft && errors.Is(err, api.ErrConflict) {
				t.Errorf("%s answered %d %s = %d, %v; want %d, %v", via.name, tc.status, tc.answer, epoch, err, tc.epoch, tc.wantErr)
			}
			if len(forwarded) != 1 || forwarded[0] != via.forwarded {
				t.Errorf("%s: requests marked forwarded %v, want [%v]", via.name, forwarded, via.forwarded)
			}
		}
	}
}
