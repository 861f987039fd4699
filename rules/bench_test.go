package rules

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParseBodyNearTheLimit parses a JSON rules document of about
// 1 MiB (5,000 rules of 128-byte names, as a follower forwards a PUT):
// what a rules write costs each member that parses it.
func BenchmarkParseBodyNearTheLimit(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"rules":[`)
	for i := range 5000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"tenant-%05d-%s","algorithm":"gcra","limit":100,"period":"1s"}`, i, strings.Repeat("x", 115))
	}
	sb.WriteString(`]}`)
	doc := []byte(sb.String())
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseBody(doc); err != nil {
			b.Fatal(err)
		}
	}
}
