package transport

import (
	"errors"
	"reflect"
	"testing"
)

// A delta part keeps its flag through the wire; a part both lost and a
// delta (no data, nothing to replace with) is refused.
func TestPushDeltaFlag(t *testing.T) {
	in := &Push{Kind: PushBackup, Epoch: 3, From: "n1", Parts: []PushPart{
		{Partition: 1, Delta: true, Data: []byte("RLP1…")},
		{Partition: 2, Data: []byte("whole")},
	}}
	frame := AppendPush(nil, 9, in)
	var out Push
	if _, err := (Limits{}).DecodePush(frame, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, &out) {
		t.Fatalf("decoded %+v, want %+v", out, *in)
	}
	bad := AppendPush(nil, 9, &Push{Kind: PushBackup, Parts: []PushPart{{Partition: 1, Lost: true, Delta: true}}})
	if _, err := (Limits{}).DecodePush(bad, &out); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("lost and delta: err %v, want a malformed frame", err)
	}
}
