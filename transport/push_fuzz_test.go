package transport

import (
	"reflect"
	"testing"
)

// FuzzDecodePush: no input panics the decoder of partition pushes (a
// hand-off or backup stream is outside bytes too); what decodes
// re-encodes to a frame that decodes to the same push.
func FuzzDecodePush(f *testing.F) {
	f.Add(AppendPush(nil, 1, &Push{Kind: PushHandoff, Epoch: 7, From: "n1",
		Parts: []PushPart{{Partition: 3, Data: []byte("abc")}, {Partition: 9, Lost: true}, {Partition: 4, Delta: true, Data: []byte("d")}}}))
	f.Add(AppendPush(nil, 2, &Push{Kind: PushBackup, From: ""}))
	f.Add(AppendPush(nil, 4, LeaseRequest("n3", 9, 31)))
	f.Add(AppendPushAck(nil, 3, &PushAck{Status: []PushStatus{1, 2}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, frame []byte) {
		var p Push
		id, err := fuzzLimits.DecodePush(frame, &p)
		if err != nil {
			return
		}
		var again Push
		id2, err := fuzzLimits.DecodePush(AppendPush(nil, id, &p), &again)
		if err != nil {
			t.Fatalf("re-encoded push does not decode: %v", err)
		}
		norm := func(p *Push) {
			for i := range p.Parts {
				if len(p.Parts[i].Data) == 0 {
					p.Parts[i].Data = nil
				}
			}
			if len(p.Parts) == 0 {
				p.Parts = nil
			}
		}
		norm(&p)
		norm(&again)
		if id2 != id || !reflect.DeepEqual(p, again) {
			t.Fatalf("push %+v re-decoded as %+v", p, again)
		}
	})
}
