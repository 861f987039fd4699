package transport

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrServerClosed is returned by Server.Serve after Shutdown or Close.
	ErrServerClosed = errors.New("transport: server closed")

	// ErrConnClosed is wrapped by the error of every call that was in
	// flight (or sent) on a connection that broke or was closed. The check
	// may or may not have been decided by the peer.
	ErrConnClosed = errors.New("transport: connection closed")

	// ErrClientClosed is returned by calls on a closed Client or Pool. It is
	// also wrapped, together with ErrConnClosed, by calls that were in
	// flight when Close was called.
	ErrClientClosed = errors.New("transport: client closed")

	// ErrDialSlow is wrapped by the error of a call that found its
	// connection being dialed for SlowDial or longer: the peer does not
	// answer its dial (its host down, packets dropped). Calls fail with
	// it at once while that dial goes on (up to DialTimeout), as after a
	// failed dial; nothing was sent.
	ErrDialSlow = errors.New("transport: dial not answered")

	// ErrQueueFull is returned by Client.Go when more than MaxPendingWrite
	// bytes of other frames wait for the connection's writer (a peer
	// that stopped reading): nothing was sent, the connection goes on.
	ErrQueueFull = errors.New("transport: more than MaxPendingWrite bytes wait to be written")

	// ErrMalformedFrame is wrapped by every error that reports bytes which
	// do not form a valid frame, including the typed errors below.
	ErrMalformedFrame = errors.New("transport: malformed frame")

	// ErrInvalidConfig is wrapped by the errors of Validate.
	ErrInvalidConfig = errors.New("transport: invalid config")
)

// FrameTooLargeError reports a frame whose size exceeds Limits.MaxFrameSize.
// Size is the whole frame, length prefix included.
type FrameTooLargeError struct {
	Size  uint64
	Limit int
}

func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("transport: frame of %d bytes exceeds limit of %d", e.Size, e.Limit)
}

// Unwrap returns ErrMalformedFrame.
func (e *FrameTooLargeError) Unwrap() error { return ErrMalformedFrame }

// TooManyChecksError reports a batch with more checks (or results) than
// Limits.MaxChecks.
type TooManyChecksError struct {
	Count uint64
	Limit int
}

func (e *TooManyChecksError) Error() string {
	return fmt.Sprintf("transport: batch of %d checks exceeds limit of %d", e.Count, e.Limit)
}

// Unwrap returns ErrMalformedFrame.
func (e *TooManyChecksError) Unwrap() error { return ErrMalformedFrame }

// UnsupportedVersionError reports a frame whose version byte this package
// does not speak.
type UnsupportedVersionError struct {
	Version uint8
}

func (e *UnsupportedVersionError) Error() string {
	return fmt.Sprintf("transport: unsupported protocol version %d (want %d)", e.Version, ProtocolVersion)
}

// Unwrap returns ErrMalformedFrame.
func (e *UnsupportedVersionError) Unwrap() error { return ErrMalformedFrame }

// UnknownFrameTypeError reports a frame whose type byte is unknown, or a
// known type that is not expected where it arrived (a response sent to a
// server, for instance).
type UnknownFrameTypeError struct {
	Type FrameType
}

func (e *UnknownFrameTypeError) Error() string {
	return fmt.Sprintf("transport: unexpected frame type %v", e.Type)
}

// Unwrap returns ErrMalformedFrame.
func (e *UnknownFrameTypeError) Unwrap() error { return ErrMalformedFrame }

// ErrorCode classifies a RemoteError.
type ErrorCode uint8

// Error codes carried by error frames.
const (
	// CodeMalformed: the peer could not decode the request frame's body
	// (the frame boundary was intact, so the connection stays up).
	CodeMalformed ErrorCode = 1
	// CodeTooLarge: the answer would exceed the peer's frame size limit.
	CodeTooLarge ErrorCode = 2
	// CodeInternal: anything else.
	CodeInternal ErrorCode = 3
	// CodeAuth: the peer requires authentication the connection did not
	// give (its first bytes were a request, not the handshake of the
	// cluster secret). Sent with request id 0, it ends the connection;
	// the RemoteError unwraps to ErrAuth.
	CodeAuth ErrorCode = 4
)

func (c ErrorCode) String() string {
	switch c {
	case CodeMalformed:
		return "malformed"
	case CodeTooLarge:
		return "too large"
	case CodeInternal:
		return "internal"
	case CodeAuth:
		return "unauthenticated"
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// RemoteError is a whole-request failure reported by the peer in an error
// frame instead of an answer. Per-check failures are Result.Status values.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("transport: peer answered %v: %s", e.Code, e.Message)
}

// Unwrap returns ErrAuth for CodeAuth, nil otherwise.
func (e *RemoteError) Unwrap() error {
	if e.Code == CodeAuth {
		return ErrAuth
	}
	return nil
}

func malformed(what string) error {
	return fmt.Errorf("%w: %s", ErrMalformedFrame, what)
}

var (
	errTruncated = malformed("truncated")
	errVarint    = malformed("varint overflows 64 bits")
)
