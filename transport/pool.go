package transport

import (
	"context"
	"sync"
	"time"
)

// Pool keeps one Client, hence one long-lived pipelined connection, per
// peer address, created on first use and redialed after failures. It is
// safe for concurrent use; the zero value is not usable, create one with
// NewPool.
type Pool struct {
	cfg ClientConfig
	err error // from NewPool: bad config

	mu      sync.Mutex
	clients map[string]*Client // guarded by mu
	closed  bool               // guarded by mu
}

// NewPool returns an empty Pool whose clients use cfg. If cfg is invalid,
// every Do returns that error.
func NewPool(cfg ClientConfig) *Pool {
	return &Pool{cfg: cfg, err: cfg.Validate(), clients: make(map[string]*Client)}
}

// Do is Client.Do on the Client for addr.
func (p *Pool) Do(ctx context.Context, addr string, req *BatchRequest, resp *BatchResponse) error {
	c, err := p.Client(addr)
	if err != nil {
		return err
	}
	return c.Do(ctx, req, resp)
}

// Go is Client.Go on the Client for addr.
func (p *Pool) Go(addr string, deadline time.Time, req *BatchRequest, resp *BatchResponse, done func(error)) {
	c, err := p.Client(addr)
	if err != nil {
		done(err)
		return
	}
	c.Go(deadline, req, resp, done)
}

// Client returns the Client for addr, creating it (without dialing yet) if
// needed. It must not be closed by the caller; use Remove.
func (p *Pool) Client(addr string) (*Client, error) {
	if p.err != nil {
		return nil, p.err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClientClosed
	}
	c := p.clients[addr]
	if c == nil {
		c = newClient(addr, p.cfg)
		p.clients[addr] = c
	}
	return c, nil
}

// Remove closes and forgets the Client for addr (a peer that left the
// ring). Calls in flight to addr fail with ErrClientClosed.
func (p *Pool) Remove(addr string) error {
	p.mu.Lock()
	c := p.clients[addr]
	delete(p.clients, addr)
	p.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}

// Close closes every Client and waits for their goroutines to end. Later
// calls return ErrClientClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	clients := p.clients
	p.clients = nil
	p.closed = true
	p.mu.Unlock()
	for _, c := range clients {
		_ = c.Close()
	}
	return nil
}
