package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Partition pushes carry whole partitions of bucket state between members:
// a hand-off from an old owner to a new one, or an owner's changed
// partitions to their backup. They travel on the same (authenticated,
// pipelined) connections as check batches.
//
// FramePushRequest body:
//
//	u8      kind (PushKind)
//	uvarint epoch: the ring epoch the sender made the push at
//	uvarint length, bytes: the sender's member id
//	uvarint number of parts n
//	n ×     uvarint partition, u8 flags (1 = lost, 2 = delta), uvarint length, bytes
//
// FramePushResponse body:
//
//	uvarint epoch: the receiver's ring epoch
//	uvarint n, n × u8 PushStatus (same order as the parts)

// Frame types of partition pushes.
const (
	FramePushRequest  FrameType = 4 // client → server: a Push
	FramePushResponse FrameType = 5 // server → client: a PushAck
)

// PushKind says what a Push is for.
type PushKind uint8

// Push kinds.
const (
	PushHandoff PushKind = 1 // old owner → new owner: the partitions it gives up
	PushBackup  PushKind = 2 // owner → backup: the latest state of changed partitions
	// PushPing is the leader's liveness probe of a member (no parts),
	// and a member's lease request to the leader (LeaseRequest): the
	// answer's epoch is the receiver's ring epoch, and a member whose
	// ring has reached it may answer for its partitions for a while
	// longer. An answer of NoLease grants no lease.
	PushPing PushKind = 3
)

// LeaseRequest returns a member's lease request to the leader: a
// PushPing at the member's ring epoch that also says its rules version,
// in the push's one part (Data: the version as a uvarint; partition 0).
// A ping's parts are read by nobody else, so a leader of an earlier
// release, which knows no such part, grants the lease as before.
func LeaseRequest(from string, epoch, rulesVersion uint64) *Push {
	return &Push{Kind: PushPing, Epoch: epoch, From: from,
		Parts: []PushPart{{Data: binary.AppendUvarint(nil, rulesVersion)}}}
}

// SaidRulesVersion returns the rules version a lease request says
// (LeaseRequest), and false for a push that says none: any other push, a
// leader's probe, or the request of a member of an earlier release.
func (p *Push) SaidRulesVersion() (uint64, bool) {
	if p.Kind != PushPing || len(p.Parts) != 1 || p.Parts[0].Partition != 0 || p.Parts[0].Lost || p.Parts[0].Delta {
		return 0, false
	}
	v, n := binary.Uvarint(p.Parts[0].Data)
	return v, n > 0 && n == len(p.Parts[0].Data)
}

// NoLease is the epoch of an answer to a PushPing that grants no lease:
// the receiver does not lead, or has not heard from the sender lately. No
// ring reaches it, so a member that reads it as an epoch takes no lease
// either.
const NoLease = ^uint64(0)

// PushPart is one partition in a Push. Data is a limiter partition export
// (Table.Export), normalised to the sender's clock at sending.
type PushPart struct {
	Partition uint32
	// Lost says the sender does not hold this partition's state (it never
	// received it, or lost it in a crash): the receiver should recover it
	// from its backup copy instead. Data is empty then.
	Lost bool
	// Delta says Data holds only the states changed since the sender's
	// previous push of this partition to this receiver
	// (limiter.Table.ExportChanges): the receiver replaces those states
	// in the copy it holds, rather than replacing the copy.
	Delta bool
	Data  []byte
}

// Push is a batch of partitions sent to one member.
type Push struct {
	Kind  PushKind
	Epoch uint64
	From  string
	Parts []PushPart
}

// PushStatus is the receiver's answer for one part.
type PushStatus uint8

// Push statuses.
const (
	PushOK       PushStatus = iota // taken (or already held: a duplicate)
	PushNotOwner                   // the receiver is not this part's owner (hand-off) or backup at its epoch
	PushRejected                   // the data did not decode, or the receiver cannot take it now
)

// PushAck answers a Push.
type PushAck struct {
	Epoch  uint64
	Status []PushStatus
}

// PushHandler takes partition pushes. A Handler given to NewServer that
// also implements PushHandler receives them; otherwise pushes are answered
// with an error frame. HandlePush is called concurrently and must set one
// status per part; push and its Data belong to the server after it returns.
type PushHandler interface {
	HandlePush(ctx context.Context, push *Push, ack *PushAck)
}

// maxPushParts bounds the parts of one push (a partition count).
const maxPushParts = 1 << 20

// AppendPush appends p as a FramePushRequest with the given id.
func AppendPush(dst []byte, id uint64, p *Push) []byte {
	start := len(dst)
	size := HeaderSize + 32 + len(p.From)
	for i := range p.Parts {
		size += 16 + len(p.Parts[i].Data)
	}
	dst = slices.Grow(dst, size)
	dst = appendHeader(dst, FramePushRequest, id)
	dst = append(dst, byte(p.Kind))
	dst = binary.AppendUvarint(dst, p.Epoch)
	dst = binary.AppendUvarint(dst, uint64(len(p.From)))
	dst = append(dst, p.From...)
	dst = binary.AppendUvarint(dst, uint64(len(p.Parts)))
	for i := range p.Parts {
		pt := &p.Parts[i]
		dst = binary.AppendUvarint(dst, uint64(pt.Partition))
		var flags byte
		if pt.Lost {
			flags |= 1
		}
		if pt.Delta {
			flags |= 2
		}
		dst = append(dst, flags)
		dst = binary.AppendUvarint(dst, uint64(len(pt.Data)))
		dst = append(dst, pt.Data...)
	}
	return finish(dst, start)
}

// PushFrameSize is the length of the frame AppendPush makes of p, length
// prefix included: what a Client compares with its Limits before it
// sends, so that a sender can split what it pushes into frames that go.
func PushFrameSize(p *Push) int {
	n := HeaderSize + 1 + uvarintLen(p.Epoch) + uvarintLen(uint64(len(p.From))) + len(p.From) + uvarintLen(uint64(len(p.Parts)))
	for i := range p.Parts {
		n += PushPartSize(&p.Parts[i])
	}
	return n
}

// PushPartSize is what part pt adds to a push's frame (PushFrameSize).
func PushPartSize(pt *PushPart) int {
	return uvarintLen(uint64(pt.Partition)) + 1 + uvarintLen(uint64(len(pt.Data))) + len(pt.Data)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// DecodePush decodes a whole FramePushRequest frame into p. The parts'
// Data are copied out of frame, so frame may be reused afterwards.
func (l Limits) DecodePush(frame []byte, p *Push) (id uint64, err error) {
	h, err := l.parseAs(frame, FramePushRequest)
	if err != nil {
		return h.ID, err
	}
	r := reader{b: frame, pos: HeaderSize}
	kind := PushKind(r.byte())
	epoch := r.uvarint()
	from := r.bytes()
	n := r.uvarint()
	if r.err != nil {
		return h.ID, r.err
	}
	if kind != PushHandoff && kind != PushBackup && kind != PushPing {
		return h.ID, malformed(fmt.Sprintf("unknown push kind %d", kind))
	}
	if len(from) > 1024 {
		return h.ID, malformed("push sender id over 1 KiB")
	}
	if n > maxPushParts || n > uint64(len(frame)-r.pos)/3 {
		return h.ID, malformed(fmt.Sprintf("%d parts cannot fit in %d bytes", n, len(frame)-r.pos))
	}
	parts := make([]PushPart, n)
	for i := range parts {
		part := r.uvarint()
		flags := r.byte()
		data := r.bytes()
		if r.err != nil {
			return h.ID, r.err
		}
		if part > 1<<32-1 || flags > 2 {
			return h.ID, malformed("bad push part header")
		}
		parts[i] = PushPart{Partition: uint32(part), Lost: flags&1 != 0, Delta: flags&2 != 0, Data: slices.Clone(data)}
	}
	if r.pos != len(frame) {
		return h.ID, malformed("bytes after push parts")
	}
	*p = Push{Kind: kind, Epoch: epoch, From: string(from), Parts: parts}
	return h.ID, nil
}

// AppendPushAck appends a as a FramePushResponse with the given id.
func AppendPushAck(dst []byte, id uint64, a *PushAck) []byte {
	start := len(dst)
	dst = appendHeader(dst, FramePushResponse, id)
	dst = binary.AppendUvarint(dst, a.Epoch)
	dst = binary.AppendUvarint(dst, uint64(len(a.Status)))
	for _, s := range a.Status {
		dst = append(dst, byte(s))
	}
	return finish(dst, start)
}

// DecodePushAck decodes a whole FramePushResponse frame into a.
func (l Limits) DecodePushAck(frame []byte, a *PushAck) (id uint64, err error) {
	h, err := l.parseAs(frame, FramePushResponse)
	if err != nil {
		return h.ID, err
	}
	r := reader{b: frame, pos: HeaderSize}
	epoch := r.uvarint()
	n := r.uvarint()
	if r.err != nil {
		return h.ID, r.err
	}
	if n != uint64(len(frame)-r.pos) {
		return h.ID, malformed("push ack length does not match frame")
	}
	st := make([]PushStatus, n)
	for i := range st {
		st[i] = PushStatus(frame[r.pos+i])
		if st[i] > PushRejected {
			return h.ID, malformed(fmt.Sprintf("unknown push status %d", st[i]))
		}
	}
	*a = PushAck{Epoch: epoch, Status: st}
	return h.ID, nil
}

// Push sends p and waits for the receiver's answer. Errors are those of Do.
func (c *Client) Push(ctx context.Context, p *Push, ack *PushAck) error {
	if p == nil || ack == nil {
		return errors.New("transport: Push with nil push or ack")
	}
	return c.call(ctx, func(cc *clientConn) (bool, error) {
		return cc.roundTrip(ctx, func(dst []byte, id uint64, _ int64) []byte { return AppendPush(dst, id, p) }, nil, ack, len(p.Parts))
	})
}

// Push is Client.Push on the Client for addr.
func (p *Pool) Push(ctx context.Context, addr string, push *Push, ack *PushAck) error {
	c, err := p.Client(addr)
	if err != nil {
		return err
	}
	return c.Push(ctx, push, ack)
}
