package ring

import (
	"fmt"
	"testing"
)

func benchRing(b *testing.B, n int) *Ring {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("node-%d", i)}
	}
	return mustNew(b, DefaultConfig(), 1, ms)
}

func BenchmarkOwnerOfKey(b *testing.B) {
	r := benchRing(b, 5)
	b.ReportAllocs()
	var h uint64
	var sink int
	for b.Loop() {
		h += 0x9e3779b97f4a7c15 // spread keys over all partitions
		_, m, _ := r.OwnerOfKey(h)
		sink += len(m.ID)
	}
	_ = sink
}

func BenchmarkOwnerOfKeyParallel(b *testing.B) {
	r := benchRing(b, 5)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var h uint64
		for pb.Next() {
			h += 0x9e3779b97f4a7c15
			r.OwnerOfKey(h)
		}
	})
}

func BenchmarkNew(b *testing.B) {
	for _, n := range []int{3, 10, 50} {
		ms := make([]Member, n)
		for i := range ms {
			ms[i] = Member{ID: fmt.Sprintf("node-%d", i)}
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(DefaultConfig(), 1, ms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
