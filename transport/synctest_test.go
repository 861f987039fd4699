package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/internal/pipenet"
)

// pipeServe serves h (with scfg) on an in-memory listener and dials it
// with ccfg, whose Dial it sets unless set. stop closes the client and
// the server and checks that Serve ended with ErrServerClosed.
func pipeServe(t *testing.T, h Handler, scfg ServerConfig, ccfg ClientConfig) (c *Client, ln *pipenet.Listener, stop func()) {
	t.Helper()
	return pipeServeOn(t, pipenet.NewListener(), h, scfg, ccfg)
}

// pipeServeOn is pipeServe on a listener of the caller's.
func pipeServeOn(t *testing.T, ln *pipenet.Listener, h Handler, scfg ServerConfig, ccfg ClientConfig) (c *Client, _ *pipenet.Listener, stop func()) {
	t.Helper()
	srv := NewServer(scfg, h)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if ccfg.Dial == nil {
		ccfg.Dial = ln.Dial
	}
	c, err := Dial(t.Context(), "pipe", ccfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, ln, func() {
		t.Helper()
		_ = c.Close()
		_ = srv.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	}
}

// pipeServeRecorded is pipeServe with default configs whose client
// records each connection it dials, in order, in *conns.
func pipeServeRecorded(t *testing.T, h Handler) (c *Client, conns *[]net.Conn, stop func()) {
	conns = new([]net.Conn)
	ln := pipenet.NewListener()
	cfg := DefaultClientConfig()
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := ln.Dial(ctx, addr)
		if err == nil {
			*conns = append(*conns, nc)
		}
		return nc, err
	}
	c, _, stop = pipeServeOn(t, ln, h, DefaultServerConfig(), cfg)
	return c, conns, stop
}

// The caller's budget reaches the handler intact, and the caller gives up
// exactly when it is spent.
func TestDeadlineTravelsWithBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		left := make(chan time.Duration, 1)
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			dl, _ := ctx.Deadline()
			left <- time.Until(dl)
			if req.Checks[0].Rule == "wait" {
				<-release
			}
			echo(ctx, req, resp)
		})
		c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())

		const budget = 100 * time.Millisecond
		ctx, cancel := context.WithTimeout(t.Context(), budget)
		req := batchOf(3, "now")
		var resp BatchResponse
		if err := c.Do(ctx, req, &resp); err != nil {
			t.Fatal(err)
		}
		checkEcho(t, req, &resp)
		if got := <-left; got != budget {
			t.Errorf("handler's budget = %v, want the caller's %v", got, budget)
		}
		cancel()

		start := time.Now()
		ctx, cancel = context.WithTimeout(t.Context(), budget)
		defer cancel()
		if err := c.Do(ctx, batchOf(3, "wait"), &resp); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do = %v, want context.DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != budget {
			t.Errorf("Do gave up after %v, want %v", waited, budget)
		}
		<-left
		close(release)

		stop()
	})
}

// A batch whose budget runs out while it waits for a busy connection's
// worker is answered without calling the handler.
func TestBudgetSpentInQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		release := make(chan struct{})
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			calls.Add(1)
			if req.Checks[0].Rule == "hold" {
				<-release
			}
			echo(ctx, req, resp)
		})
		cfg := DefaultServerConfig()
		cfg.MaxConcurrentBatches = 1
		c, _, stop := pipeServe(t, h, cfg, DefaultClientConfig())

		held := make(chan error, 1)
		go func() { held <- c.Do(t.Context(), batchOf(1, "hold"), new(BatchResponse)) }()
		synctest.Wait() // the only worker is busy

		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if err := c.Do(ctx, batchOf(1, "queued"), new(BatchResponse)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("queued Do = %v, want context.DeadlineExceeded", err)
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		// Frames of a connection reach its single worker in order, so once
		// this answer is back the queued batch has been dealt with.
		req := batchOf(2, "after")
		var resp BatchResponse
		if err := c.Do(t.Context(), req, &resp); err != nil {
			t.Fatal(err)
		}
		checkEcho(t, req, &resp)
		if n := calls.Load(); n != 2 {
			t.Errorf("handler called %d times, want 2 (the spent batch skipped)", n)
		}
		stop()
	})
}

// A peer that goes silent (a network cut leaves TCP open and quiet) does
// not hold the connection for ever: a call that times out after the
// connection has returned nothing for deadConnSilence drops it, and the
// next call dials afresh. A call that times out sooner keeps it.
func TestSilentPeerConnectionIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			if req.Checks[0].Rule == "hold" {
				<-release
			}
			echo(ctx, req, resp)
		})
		ln := pipenet.NewListener()
		srv := NewServer(DefaultServerConfig(), h)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		var dials atomic.Int32
		ccfg := DefaultClientConfig()
		ccfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			return ln.Dial(ctx, addr)
		}
		c, err := Dial(t.Context(), "pipe", ccfg)
		if err != nil {
			t.Fatal(err)
		}
		call := func(rule string, budget time.Duration) error {
			ctx, cancel := context.WithTimeout(t.Context(), budget)
			defer cancel()
			return c.Do(ctx, batchOf(1, rule), new(BatchResponse))
		}
		if err := call("hold", 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("short call: %v", err)
		}
		if err := call("ok", time.Second); err != nil || dials.Load() != 1 {
			t.Fatalf("after a short timeout: %v, %d dials; want the same connection", err, dials.Load())
		}
		if err := call("hold", 2*deadConnSilence); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("long call: %v", err)
		}
		if err := call("ok", time.Second); err != nil || dials.Load() != 2 {
			t.Fatalf("after %v of silence: %v, %d dials; want a new connection", 2*deadConnSilence, err, dials.Load())
		}
		close(release)
		_ = c.Close()
		_ = srv.Close()
		<-served
	})
}

// promptHandler is a PromptHandler whose batches named "prompt…" say
// they decide at once; a batch named "…hold" waits for release.
type promptHandler struct {
	entered chan string
	release chan struct{}
}

func (h *promptHandler) Prompt(req *BatchRequest) bool {
	return len(req.Checks) > 0 && len(req.Checks[0].Rule) >= 6 && req.Checks[0].Rule[:6] == "prompt"
}

func (h *promptHandler) HandleBatch(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
	r := req.Checks[0].Rule
	h.entered <- r
	if len(r) >= 4 && r[len(r)-4:] == "hold" {
		<-h.release
	}
	echo(ctx, req, resp)
}

// A PromptHandler's prompt batch is decided on the connection's read
// loop: the frame behind it is not read until it is done. A batch that is
// not prompt goes to a worker, and the frame behind it is decided
// meanwhile.
func TestPromptBatchDecidedOnReadLoop(t *testing.T) {
	for _, tc := range []struct {
		first       string
		secondFirst bool // the second batch is decided while the first holds
	}{
		{"prompt-hold", false},
		{"worker-hold", true},
	} {
		t.Run(tc.first, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := &promptHandler{entered: make(chan string, 2), release: make(chan struct{})}
				c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())
				do := func(rule string) chan error {
					done := make(chan error, 1)
					go func() {
						req := batchOf(2, rule)
						var resp BatchResponse
						err := c.Do(t.Context(), req, &resp)
						if err == nil {
							checkEcho(t, req, &resp)
						}
						done <- err
					}()
					return done
				}
				first := do(tc.first)
				if got := <-h.entered; got != tc.first {
					t.Fatalf("handler got %q first, want %q", got, tc.first)
				}
				second := do("prompt-next")
				synctest.Wait()
				select {
				case got := <-h.entered:
					if !tc.secondFirst {
						t.Fatalf("%q decided while the prompt batch before it held the read loop", got)
					}
					if err := <-second; err != nil {
						t.Fatal(err)
					}
				default:
					if tc.secondFirst {
						t.Fatal("the batch behind a worker's batch was not decided while that one held")
					}
				}
				close(h.release)
				if err := <-first; err != nil {
					t.Fatal(err)
				}
				if !tc.secondFirst {
					if got := <-h.entered; got != "prompt-next" {
						t.Fatalf("handler got %q, want prompt-next", got)
					}
					if err := <-second; err != nil {
						t.Fatal(err)
					}
				}
				stop()
			})
		})
	}
}

// Go delivers each call's outcome to its done exactly once: the answer,
// the deadline (the late answer dropped), the connection's failure, or
// the closed client's refusal.
func TestGoDeliversOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			if req.Checks[0].Rule == "hold" {
				<-release
			}
			echo(ctx, req, resp)
		})
		c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())
		type outcome struct {
			err   error
			calls int
		}
		start := func(rule string, d time.Duration) (*BatchRequest, *BatchResponse, *outcome) {
			req, resp, o := batchOf(3, rule), &BatchResponse{}, &outcome{}
			c.Go(time.Now().Add(d), req, resp, func(err error) { o.err = err; o.calls++ })
			return req, resp, o
		}
		once := func(name string, o *outcome, want error) {
			t.Helper()
			synctest.Wait()
			if o.calls != 1 || !errors.Is(o.err, want) {
				t.Fatalf("%s: done called %d times, last with %v; want once with %v", name, o.calls, o.err, want)
			}
		}

		req, resp, o := start("now", time.Second)
		once("answered", o, nil)
		checkEcho(t, req, resp)

		_, _, o = start("hold", 100*time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		once("deadline", o, context.DeadlineExceeded)
		close(release) // the late answer comes back to nobody
		synctest.Wait()
		if o.calls != 1 {
			t.Fatalf("the late answer reached done: %d calls", o.calls)
		}

		req, resp, o = start("now", time.Second) // the connection is still good
		once("after a late answer", o, nil)
		checkEcho(t, req, resp)

		_, _, o = start("now", 0)
		once("no budget", o, context.DeadlineExceeded)

		release = make(chan struct{})
		_, _, held := start("hold", time.Second)
		synctest.Wait()
		_ = c.Close()
		once("client closed in flight", held, ErrClientClosed)
		_, _, o = start("now", time.Second)
		once("client closed", o, ErrClientClosed)
		close(release)
		stop() // closes the client again: a no-op
	})
}

// A connection that breaks fails the calls of Go in flight on it, once
// each, and the next Go dials afresh.
func TestGoConnectionBreaks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			if req.Checks[0].Rule == "hold" {
				<-ctx.Done()
				return
			}
			echo(ctx, req, resp)
		})
		c, conns, stop := pipeServeRecorded(t, h)
		var calls []error
		c.Go(time.Now().Add(time.Second), batchOf(1, "hold"), &BatchResponse{}, func(err error) { calls = append(calls, err) })
		synctest.Wait()
		_ = (*conns)[0].Close()
		synctest.Wait()
		if len(calls) != 1 || !errors.Is(calls[0], ErrConnClosed) {
			t.Fatalf("done got %v, want one error wrapping ErrConnClosed", calls)
		}
		req, resp := batchOf(2, "now"), &BatchResponse{}
		c.Go(time.Now().Add(time.Second), req, resp, func(err error) { calls = append(calls, err) })
		synctest.Wait()
		if len(calls) != 2 || calls[1] != nil || len(*conns) != 2 {
			t.Fatalf("after the break: done got %v over %d connections, want nil over a second one", calls, len(*conns))
		}
		checkEcho(t, req, resp)
		stop()
	})
}

// A connection presumed dead because a short call timed out in silence is
// retired, not failed: a longer call in flight on it still gets its answer
// from a peer that was only slow, new calls go to a new connection, and
// the retired one closes once its last call is done.
func TestSilentConnectionRetiresWithoutFailingLongerCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		// The lost call's answer never comes while the test looks: had it
		// waited for its context, it would race the client's own timer
		// (both end at the same instant of the fake clock), and an answer
		// read first would count as the connection speaking.
		lostGone := make(chan struct{})
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			switch req.Checks[0].Rule {
			case "slow":
				<-release
			case "lost":
				<-lostGone
				return
			}
			echo(ctx, req, resp)
		})
		c, conns, stop := pipeServeRecorded(t, h)
		var slow []error
		slowReq, slowResp := batchOf(1, "slow"), &BatchResponse{}
		c.Go(time.Now().Add(10*deadConnSilence), slowReq, slowResp, func(err error) { slow = append(slow, err) })
		time.Sleep(deadConnSilence) // the fake clock: the connection has been silent this long
		var lost []error
		c.Go(time.Now().Add(deadConnSilence/4), batchOf(1, "lost"), &BatchResponse{}, func(err error) { lost = append(lost, err) })
		time.Sleep(deadConnSilence / 2)
		synctest.Wait()
		if len(lost) != 1 || !errors.Is(lost[0], context.DeadlineExceeded) || len(slow) != 0 {
			t.Fatalf("after the short call's deadline: short %v, long %v; want the short one expired, the long one waiting", lost, slow)
		}
		req, resp := batchOf(2, "now"), &BatchResponse{}
		var now []error
		c.Go(time.Now().Add(time.Second), req, resp, func(err error) { now = append(now, err) })
		synctest.Wait()
		if len(now) != 1 || now[0] != nil || len(*conns) != 2 {
			t.Fatalf("a new call: %v over %d connections, want an answer over a second one", now, len(*conns))
		}
		checkEcho(t, req, resp)
		close(lostGone)
		close(release)
		synctest.Wait()
		if len(slow) != 1 || slow[0] != nil {
			t.Fatalf("the long call on the retired connection: %v, want its answer", slow)
		}
		checkEcho(t, slowReq, slowResp)
		if _, err := (*conns)[0].Write([]byte{0}); err == nil {
			t.Fatal("the retired connection is still open after its last call")
		}
		stop()
	})
}

// A call of Go whose deadline passes between its registration and the
// write of its frame is delivered and recycled meanwhile; a Go that takes
// the recycled call must not have its batch sent in the first call's
// place. Was: start wrote the call's own buffer, which the second Go had
// re-encoded, so the second batch was decided twice (a double spend) and
// the first never (or a torn frame, when their lengths differed).
func TestGoFrameOutlivesItsRecycledCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		decided := map[uint64]int{} // key hash → times decided
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			mu.Lock()
			for _, c := range req.Checks {
				decided[c.KeyHash]++
			}
			mu.Unlock()
			echo(ctx, req, resp)
		})
		c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())
		defer stop()
		if err := c.Do(t.Context(), batchOf(1, "warm"), new(BatchResponse)); err != nil {
			t.Fatal(err)
		}
		a, b := batchOf(1, "r"), batchOf(1, "r")
		a.Checks[0].KeyHash, b.Checks[0].KeyHash = 1001, 1002
		var aErr, bErr error
		hooked := false
		c.beforeGoWrite = func() {
			if hooked {
				return
			}
			hooked = true
			time.Sleep(10 * time.Millisecond) // a's 5 ms deadline passes: a is delivered and its call recycled
			// b, with a budget of the same encoded length, likely takes a's call.
			c.Go(time.Now().Add(200*time.Millisecond), b, new(BatchResponse), func(err error) { mu.Lock(); bErr = err; mu.Unlock() })
		}
		c.Go(time.Now().Add(5*time.Millisecond), a, new(BatchResponse), func(err error) { mu.Lock(); aErr = err; mu.Unlock() })
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(aErr, context.DeadlineExceeded) || bErr != nil {
			t.Fatalf("a: %v (want DeadlineExceeded), b: %v (want nil)", aErr, bErr)
		}
		if decided[1001] != 1 || decided[1002] != 1 {
			t.Fatalf("the owner decided a %d times and b %d times; want each once (a's frame left after its deadline)", decided[1001], decided[1002])
		}
	})
}

// blockingPusher holds every push until release is closed.
type blockingPusher struct {
	running atomic.Int32
	release chan struct{}
}

func (h *blockingPusher) HandleBatch(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
	echo(ctx, req, resp)
}

func (h *blockingPusher) HandlePush(_ context.Context, p *Push, a *PushAck) {
	h.running.Add(1)
	<-h.release
	a.Status = make([]PushStatus, len(p.Parts))
}

// A peer that sends pushes faster than they are handled holds at most
// maxPushBytes of their copies (or maxPushes of them) on one connection:
// the read loop waits, and TCP holds the peer back. Was: a goroutine and
// a decoded copy per push without bound (500 pushes of 1 MiB, 500 MiB
// held at once).
func TestPushesInFlightAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &blockingPusher{release: make(chan struct{})}
		ln := pipenet.NewListener()
		srv := NewServer(DefaultServerConfig(), h)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		nc, err := ln.Dial(t.Context(), "pipe")
		if err != nil {
			t.Fatal(err)
		}
		big := make([]byte, 1<<20)
		sent := make(chan int, 1)
		go func() {
			n := 0
			for i := range 500 {
				p := &Push{Kind: PushBackup, From: "x", Parts: []PushPart{{Partition: 1, Data: big}}}
				if _, err := nc.Write(AppendPush(nil, uint64(i+1), p)); err != nil {
					break
				}
				n++
			}
			sent <- n
		}()
		synctest.Wait()
		if got, most := h.running.Load(), int32(maxPushBytes/len(big)); got > most || got == 0 {
			t.Errorf("%d pushes of 1 MiB held at once on one connection; want 1 to %d", got, most)
		}
		close(h.release)
		_ = nc.Close()
		<-sent
		_ = srv.Close()
		<-served
	})
}

// A caller that cancels its call (its own client went away) does not
// retire a healthy connection: a cancel says nothing of the peer. Was:
// any ctx end on a connection idle for a second redialled it.
func TestCancelledCallKeepsAnIdleConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			if req.Checks[0].Rule == "slow" {
				time.Sleep(20 * time.Millisecond)
			}
			echo(ctx, req, resp)
		})
		c, conns, stop := pipeServeRecorded(t, h)
		defer stop()
		if err := c.Do(t.Context(), batchOf(1, "ok"), new(BatchResponse)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // idle: nothing to answer
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Millisecond, cancel)
		if err := c.Do(ctx, batchOf(1, "slow"), new(BatchResponse)); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		if err := c.Do(t.Context(), batchOf(1, "ok"), new(BatchResponse)); err != nil {
			t.Fatal(err)
		}
		if len(*conns) != 1 {
			t.Errorf("a cancelled call retired a healthy connection: %d dials", len(*conns))
		}
	})
}

// panickyPrompt panics in Prompt for batches named "boom".
type panickyPrompt struct{}

func (panickyPrompt) Prompt(req *BatchRequest) bool {
	if req.Checks[0].Rule == "boom" {
		panic("prompt boom")
	}
	return true
}

func (panickyPrompt) HandleBatch(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
	echo(ctx, req, resp)
}

// A panic in Prompt is logged and the batch decided on a worker, as a
// panic in HandleBatch is recovered. Was: it ran on the read loop
// unrecovered and killed the process.
func TestPromptPanicIsRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var logged []error
		scfg := DefaultServerConfig()
		scfg.ErrorLog = func(err error) { mu.Lock(); logged = append(logged, err); mu.Unlock() }
		c, _, stop := pipeServe(t, panickyPrompt{}, scfg, DefaultClientConfig())
		defer stop()
		req, resp := batchOf(2, "boom"), new(BatchResponse)
		if err := c.Do(t.Context(), req, resp); err != nil {
			t.Fatalf("a batch whose Prompt panicked: %v", err)
		}
		checkEcho(t, req, resp)
		mu.Lock()
		defer mu.Unlock()
		if len(logged) != 1 || !strings.Contains(logged[0].Error(), "prompt boom") {
			t.Errorf("logged %v, want the prompt panic once", logged)
		}
	})
}

// Close waits for a Go's done that runs on its deadline timer, as it
// waits for every goroutine of the client. Was: it returned while done
// was still running.
func TestCloseWaitsForATimersDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release, hold := make(chan struct{}), make(chan struct{})
		h := HandlerFunc(func(ctx context.Context, req *BatchRequest, resp *BatchResponse) {
			<-hold // never answers in time
		})
		c, _, stop := pipeServe(t, h, DefaultServerConfig(), DefaultClientConfig())
		inDone, doneReturned := make(chan struct{}), make(chan struct{})
		c.Go(time.Now().Add(10*time.Millisecond), batchOf(1, "r"), new(BatchResponse), func(err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("done: %v", err)
			}
			close(inDone)
			<-release
			close(doneReturned)
		})
		<-inDone
		closed := make(chan struct{})
		go func() { _ = c.Close(); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Error("Client.Close returned while a done of the client was still running")
		default:
		}
		close(release)
		<-closed
		select {
		case <-doneReturned:
		default:
			t.Error("Close returned before done did")
		}
		close(hold)
		stop()
	})
}
