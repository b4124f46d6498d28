package writeback

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The extents hold what a byte array written and cut the same way holds:
// sorted, never overlapping nor touching, with the bytes each write added
// and replaced counted right.
func TestDirtyModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var d dirty
		model := []byte{}
		known := []bool{}
		var total int64
		for range 50 {
			if r.IntN(8) == 0 {
				size := int64(r.IntN(300))
				total -= d.truncate(size)
				if int64(len(model)) > size {
					model, known = model[:size], known[:size]
				}
				for int64(len(model)) < size {
					model, known = append(model, 0), append(known, false)
				}
				continue
			}
			off, n := int64(r.IntN(256)), 1+r.IntN(64)
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.Uint32())
			}
			var replaced int64
			for int64(len(model)) < off+int64(n) {
				model, known = append(model, 0), append(known, false)
			}
			for i := range p {
				if known[off+int64(i)] {
					replaced++
				}
				model[off+int64(i)], known[off+int64(i)] = p[i], true
			}
			added, rep := d.write(off, p)
			total += added
			if rep != replaced {
				t.Fatalf("round %d: write at %d of %d replaced %d, want %d", round, off, n, rep, replaced)
			}
		}
		if d.size != int64(len(model)) || d.bytes() != total {
			t.Fatalf("round %d: size %d bytes %d, want %d and %d", round, d.size, d.bytes(), len(model), total)
		}
		for i := 1; i < len(d.ext); i++ {
			if d.ext[i].off <= d.ext[i-1].end() {
				t.Fatalf("round %d: extents %d and %d overlap or touch", round, i-1, i)
			}
		}
		got := make([]byte, len(model))
		d.overlay(got, 0)
		want := make([]byte, len(model))
		for i := range model {
			if known[i] {
				want[i] = model[i]
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: the overlay differs from the model", round)
		}
		for i := range known {
			if known[i] != d.covers(int64(i), 1) {
				t.Fatalf("round %d: covers(%d) = %v, want %v", round, i, !known[i], known[i])
			}
		}
	}
}
