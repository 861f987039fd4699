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

// A lease request says its member's rules version (0 too: no rules
// written yet) through the wire, in a part that a leader of an earlier
// release, which reads no part of a ping, ignores; a probe and every
// other push say none, nor does a ping whose part is not a whole uvarint.
func TestLeaseRequestSaysRulesVersion(t *testing.T) {
	for _, v := range []uint64{0, 40, 1 << 60} {
		var out Push
		if _, err := (Limits{}).DecodePush(AppendPush(nil, 5, LeaseRequest("n2", 12, v)), &out); err != nil {
			t.Fatal(err)
		}
		if got, ok := out.SaidRulesVersion(); !ok || got != v || out.Kind != PushPing || out.Epoch != 12 || out.From != "n2" {
			t.Fatalf("lease request of rules version %d decoded as %+v, saying %d %v", v, out, got, ok)
		}
	}
	for name, p := range map[string]*Push{
		"probe":       {Kind: PushPing, Epoch: 3, From: "n1"},
		"backup":      {Kind: PushBackup, Parts: []PushPart{{Data: []byte{7}}}},
		"two parts":   {Kind: PushPing, Parts: []PushPart{{Data: []byte{7}}, {Data: []byte{8}}}},
		"other part":  {Kind: PushPing, Parts: []PushPart{{Partition: 2, Data: []byte{7}}}},
		"no uvarint":  {Kind: PushPing, Parts: []PushPart{{Data: []byte{0x80}}}},
		"extra bytes": {Kind: PushPing, Parts: []PushPart{{Data: []byte{7, 7}}}},
		"empty part":  {Kind: PushPing, Parts: []PushPart{{}}},
		"lost part":   {Kind: PushPing, Parts: []PushPart{{Lost: true}}},
	} {
		if v, ok := p.SaidRulesVersion(); ok {
			t.Errorf("%s says rules version %d, want none", name, v)
		}
	}
}

// PushFrameSize is the length of the frame AppendPush makes, whatever
// the lengths of its varints.
func TestPushFrameSize(t *testing.T) {
	for _, p := range []*Push{
		{Kind: PushPing, From: "n1"},
		{Kind: PushHandoff, Epoch: 1 << 40, From: "a-longer-member-id", Parts: []PushPart{{Partition: 5, Lost: true}}},
		{Kind: PushBackup, Epoch: 300, From: "n2", Parts: []PushPart{
			{Partition: 1 << 20, Data: make([]byte, 200)},
			{Partition: 127, Delta: true, Data: make([]byte, 1<<14)},
			{Partition: 128, Data: make([]byte, 127)},
		}},
	} {
		if got, want := PushFrameSize(p), len(AppendPush(nil, 1<<60, p)); got != want {
			t.Errorf("PushFrameSize(%d parts from %q) = %d, want %d", len(p.Parts), p.From, got, want)
		}
	}
}
