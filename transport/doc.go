// Package transport is ringlimit's node-to-node data plane: the binary
// protocol that carries batches of rate-limit checks from a router to the
// node that owns them, and the answers back. It knows nothing of what a
// check means; a [Handler] on the owner decides.
//
// # Model
//
// Everything travels in length-prefixed frames (see codec.go for the byte
// layout). A frame carries a version byte and a type byte, so new frame
// types (partition hand-off streams, backup replication) can be added later;
// a peer that meets an unknown version or type closes the connection with an
// [*UnsupportedVersionError] or [*UnknownFrameTypeError].
//
// One [BatchRequest] frame carries many checks. Rule names are sent once per
// frame in a name table and decoded into strings that are shared by every
// check of the frame (and reused from the previous frame when they repeat),
// so decoding allocates nothing in steady state. Every frame carries a
// request id; a [Client] keeps many requests in flight on one connection and
// matches answers by id (pipelining). The caller's context deadline travels
// in the frame as a relative budget (nodes' clocks are not comparable); the
// owner starts the budget when the frame arrives and answers checks of a
// frame whose budget is already spent with [StatusUnavailable] without
// calling the handler.
//
// A [Client] holds one long-lived connection to one address and redials it
// lazily after it breaks; a [Pool] holds one Client per address. A [Server]
// runs one read loop per connection, up to MaxConcurrentBatches handler calls
// per connection at once, and one writer per connection that coalesces
// answers into few syscalls. The client side has the same writer.
//
// # Authentication and bounds
//
// Connections are authenticated once, when they open, before any frame
// (auth.go): mutual TLS and/or a cluster-secret challenge–response, set by
// an [Auth]. Serve a [Listener] (NewListener), which authenticates
// concurrently, caps open and authenticating connections and hands out
// only those that passed; set ClientConfig.Dial to Auth.Dial. Every frame
// type, present and future (hand-off, backup streams), travels on such
// connections, so none needs authentication of its own. ReadFrame grows
// its buffer as bytes arrive, and the Server drops a connection on which
// no whole frame arrived within IdleTimeout.
//
// # Concurrency
//
// Client, Pool and Server are safe for concurrent use. A [Handler] is called
// concurrently, from many connections and from many batches of one
// connection. The codec functions are pure: they share nothing and may run
// concurrently on distinct buffers. Every goroutine this package starts ends
// when its Client, Pool or Server is closed: Client.Close and Server.Close
// wait for them; Server.Close also cancels every handler context, so
// handlers must honour ctx. A [PromptHandler]'s batch that it says will
// not wait is decided on the connection's read goroutine (no hand-off to a
// worker) when no frame waits behind it. [Client.Go] sends a batch without
// a goroutine waiting for its answer: its done function is called once,
// from the read goroutine, a deadline timer or a failure.
//
// A connection that has returned nothing for a second while a call on it
// timed out is presumed dead and retired: new calls dial a new one, and
// the calls in flight on it keep their own deadlines (a slow peer still
// answers them); it closes when they are done.
//
// Errors are sentinels and typed errors meant for errors.Is and errors.As:
// a broken connection fails every call in flight with an error wrapping
// [ErrConnClosed]; every decoding failure wraps [ErrMalformedFrame].
package transport
