package transport

import (
	"context"
	"fmt"
	"net"
	"time"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Limits bound the frames the server accepts.
	Limits Limits
	// MaxConcurrentBatches is the most handler calls running at once for
	// one connection; the connection is not read while all are busy.
	MaxConcurrentBatches int
	// ReadBufferSize is the size of each connection's read buffer.
	ReadBufferSize int
	// MaxPendingWrite is how many bytes of answers may wait for one
	// connection's writer before handlers block (one frame is always let
	// through).
	MaxPendingWrite int
	// WriteTimeout bounds each write to a connection; a peer that does not
	// read for that long is disconnected. 0 means no timeout.
	WriteTimeout time.Duration
	// IdleTimeout closes a connection on which no whole frame arrived for
	// that long (a silent or trickling peer). 0 means no timeout.
	IdleTimeout time.Duration
	// ErrorLog, if set, receives connection errors and recovered handler
	// panics. It is called concurrently.
	ErrorLog func(error)
}

// DefaultServerConfig returns the defaults: DefaultLimits, 64 concurrent
// batches per connection, 64 KiB read buffers, 4 MiB of pending answers, a
// 10 s write timeout and a 2 min idle timeout.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		Limits:               DefaultLimits(),
		MaxConcurrentBatches: 64,
		ReadBufferSize:       64 << 10,
		MaxPendingWrite:      4 << 20,
		WriteTimeout:         10 * time.Second,
		IdleTimeout:          2 * time.Minute,
	}
}

// Validate reports whether c is usable. It changes nothing.
func (c ServerConfig) Validate() error {
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.MaxConcurrentBatches < 1 || c.MaxConcurrentBatches > 1<<16 {
		return fmt.Errorf("%w: MaxConcurrentBatches %d not in [1, 65536]", ErrInvalidConfig, c.MaxConcurrentBatches)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, c.IdleTimeout)
	}
	return validateIO(c.ReadBufferSize, c.MaxPendingWrite, c.WriteTimeout)
}

// ClientConfig configures a Client or a Pool.
type ClientConfig struct {
	// Limits bound the frames the client sends and accepts.
	Limits Limits
	// DialTimeout bounds each dial. No caller's context bounds a dial:
	// each waits for it up to its own (see Client.Go).
	DialTimeout time.Duration
	// SlowDial is how long a dial may go on before the calls that wait
	// for it, and those after them, fail with ErrDialSlow (the dial goes
	// on, up to DialTimeout): a peer that drops its dial's packets fails
	// its calls fast, not each at its deadline. 0: calls wait for a dial
	// up to their own deadline.
	SlowDial time.Duration
	// RedialBackoff is how long after a failed dial calls fail at once
	// (with the dial's error) instead of dialing again. 0 disables it.
	RedialBackoff time.Duration
	// ReadBufferSize is the size of the connection's read buffer.
	ReadBufferSize int
	// MaxPendingWrite is how many bytes of requests may wait for the
	// connection's writer before callers block (one frame is always let
	// through).
	MaxPendingWrite int
	// WriteTimeout bounds each write to the connection; 0 means none.
	WriteTimeout time.Duration
	// Dial, if set, opens connections instead of a net.Dialer on "tcp"
	// (for TLS, or in-memory connections in tests).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// DefaultClientConfig returns the defaults: DefaultLimits, a 2 s dial
// timeout, calls failing after 100 ms of a dial (SlowDial), 100 ms
// redial back-off, 64 KiB read buffer, 4 MiB of pending
// requests and a 10 s write timeout.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		Limits:          DefaultLimits(),
		DialTimeout:     2 * time.Second,
		SlowDial:        100 * time.Millisecond,
		RedialBackoff:   100 * time.Millisecond,
		ReadBufferSize:  64 << 10,
		MaxPendingWrite: 4 << 20,
		WriteTimeout:    10 * time.Second,
	}
}

// Validate reports whether c is usable. It changes nothing.
func (c ClientConfig) Validate() error {
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("%w: DialTimeout %v must be positive", ErrInvalidConfig, c.DialTimeout)
	}
	if c.SlowDial < 0 {
		return fmt.Errorf("%w: SlowDial %v is negative", ErrInvalidConfig, c.SlowDial)
	}
	if c.RedialBackoff < 0 {
		return fmt.Errorf("%w: RedialBackoff %v is negative", ErrInvalidConfig, c.RedialBackoff)
	}
	return validateIO(c.ReadBufferSize, c.MaxPendingWrite, c.WriteTimeout)
}

func validateIO(readBuf, maxPending int, writeTimeout time.Duration) error {
	if readBuf < HeaderSize || readBuf > 64<<20 {
		return fmt.Errorf("%w: ReadBufferSize %d not in [%d, 64 MiB]", ErrInvalidConfig, readBuf, HeaderSize)
	}
	if maxPending < 1 {
		return fmt.Errorf("%w: MaxPendingWrite %d must be positive", ErrInvalidConfig, maxPending)
	}
	if writeTimeout < 0 {
		return fmt.Errorf("%w: WriteTimeout %v is negative", ErrInvalidConfig, writeTimeout)
	}
	return nil
}
