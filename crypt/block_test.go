package crypt

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// testLayer is a Layer keyed from the fixed master key 00 01 … 1f.
func testLayer(t testing.TB) *Layer {
	t.Helper()
	master := make([]byte, masterKeySize)
	for i := range master {
		master[i] = byte(i)
	}
	l, err := newLayer(master, 1)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestBlockRoundTrip(t *testing.T) {
	l := testLayer(t)
	r := rand.New(rand.NewPCG(3, 4))
	hdr, err := l.NewHeader()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.CheckHeader(hdr); err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 15, 16, 17, blockSize - 1, blockSize}
	for range 200 {
		sizes = append(sizes, r.IntN(blockSize+1))
	}
	for _, n := range sizes {
		plain := randBytes(r, n)
		blk := r.Uint64()
		prefix := []byte("kept")
		stored, err := l.EncodeBlock(bytes.Clone(prefix), hdr, blk, plain)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(stored, prefix) || len(stored) != len(prefix)+n+l.Overhead() {
			t.Fatalf("n=%d: EncodeBlock gave %d bytes, want the prefix and %d", n, len(stored), n+l.Overhead())
		}
		got, err := l.DecodeBlock([]byte("kept"), hdr, blk, stored[len(prefix):])
		if err != nil || !bytes.Equal(got[len(prefix):], plain) || !bytes.HasPrefix(got, prefix) {
			t.Fatalf("n=%d: DecodeBlock = %v", n, err)
		}
		again, _ := l.EncodeBlock(nil, hdr, blk, plain)
		if bytes.Equal(again, stored[len(prefix):]) {
			t.Fatalf("n=%d: two encodings are equal: nonces repeat", n)
		}
	}
	if _, err := l.EncodeBlock(nil, hdr, 0, make([]byte, blockSize+1)); err == nil {
		t.Error("EncodeBlock took more than a block")
	}
}

// mustFail checks that a decode fails and returns no plaintext.
func mustFail(t *testing.T, what string, out []byte, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: decoded to %d bytes, want an error", what, len(out))
	}
}

// Every alteration of a stored block, or of where it sits, fails to decode.
func TestBlockTamper(t *testing.T) {
	l := testLayer(t)
	r := rand.New(rand.NewPCG(5, 6))
	hdrA, _ := l.NewHeader()
	hdrB, _ := l.NewHeader()
	plain := randBytes(r, blockSize)
	stored, _ := l.EncodeBlock(nil, hdrA, 3, plain)
	other, _ := l.EncodeBlock(nil, hdrA, 4, plain)

	// A flipped bit anywhere: nonce, ciphertext or tag.
	for i := range stored {
		bad := bytes.Clone(stored)
		bad[i] ^= 1 << (i % 8)
		out, err := l.DecodeBlock(nil, hdrA, 3, bad)
		mustFail(t, "flipped byte", out, err)
	}
	// Swapped between block numbers of one file.
	out, err := l.DecodeBlock(nil, hdrA, 4, stored)
	mustFail(t, "block 3 read as block 4", out, err)
	out, err = l.DecodeBlock(nil, hdrA, 3, other)
	mustFail(t, "block 4 read as block 3", out, err)
	// Moved to another file at the same block number.
	out, err = l.DecodeBlock(nil, hdrB, 3, stored)
	mustFail(t, "block moved to another file", out, err)
	// Cut short: mid-ciphertext, inside the tag, inside the nonce, nothing.
	for _, n := range []int{len(stored) - 1, len(stored) - tagSize, blockOverhead, blockNonceSize, 1, 0} {
		out, err = l.DecodeBlock(nil, hdrA, 3, stored[:n])
		mustFail(t, "truncated block", out, err)
	}
	// Extended: a block of a shorter file that grew a byte.
	out, err = l.DecodeBlock(nil, hdrA, 3, append(bytes.Clone(stored), 0))
	mustFail(t, "extended block", out, err)
	// All zeros (a hole punched in the lower file) is not a block.
	out, err = l.DecodeBlock(nil, hdrA, 3, make([]byte, len(stored)))
	mustFail(t, "zeroed block", out, err)
	// A header of the wrong version or size, or replaced.
	bad := bytes.Clone(hdrA)
	bad[1] = 2
	if l.CheckHeader(bad) == nil {
		t.Error("CheckHeader took version 2")
	}
	if l.CheckHeader(hdrA[:headerSize-1]) == nil || l.CheckHeader(append(bytes.Clone(hdrA), 0)) == nil {
		t.Error("CheckHeader took a header of the wrong size")
	}
	if l.CheckHeader([]byte{0, 1, 15: 0, 17: 0}) == nil {
		t.Error("CheckHeader took an all-zero file ID")
	}
	out, err = l.DecodeBlock(nil, hdrA[:4], 3, stored)
	mustFail(t, "short header", out, err)
	// Another layer's key.
	master := make([]byte, masterKeySize)
	l2, _ := newLayer(master, 1)
	out, err = l2.DecodeBlock(nil, hdrA, 3, stored)
	mustFail(t, "another master key", out, err)
}

func BenchmarkEncodeBlock(b *testing.B) {
	l := testLayer(b)
	hdr, _ := l.NewHeader()
	plain := make([]byte, blockSize)
	dst := make([]byte, 0, blockSize+blockOverhead)
	b.SetBytes(blockSize)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		var err error
		if dst, err = l.EncodeBlock(dst[:0], hdr, uint64(i), plain); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBlock(b *testing.B) {
	l := testLayer(b)
	hdr, _ := l.NewHeader()
	stored, _ := l.EncodeBlock(nil, hdr, 7, make([]byte, blockSize))
	dst := make([]byte, 0, blockSize)
	b.SetBytes(blockSize)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = l.DecodeBlock(dst[:0], hdr, 7, stored); err != nil {
			b.Fatal(err)
		}
	}
	if !bytes.Equal(dst, make([]byte, blockSize)) {
		b.Fatal("wrong plaintext")
	}
}
