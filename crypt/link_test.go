package crypt

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestLinkRoundTrip(t *testing.T) {
	l := testLayer(t)
	r := rand.New(rand.NewPCG(9, 10))
	const most = 4095 // the longest target symlink(2) takes
	targets := [][]byte{{}, []byte("/"), []byte("../a/b"), []byte("ünï/☃"), bytes.Repeat([]byte("a/"), most/2), bytes.Repeat([]byte("x"), most)}
	for range 100 {
		targets = append(targets, randBytes(r, r.IntN(most+1)))
	}
	for _, target := range targets {
		stored, err := l.EncodeLink(target)
		if err != nil {
			t.Fatalf("EncodeLink(%d bytes): %v", len(target), err)
		}
		if bytes.IndexByte(stored, 0) >= 0 || bytes.IndexByte(stored, '.') >= 0 {
			t.Fatalf("EncodeLink(%d bytes) stored a NUL or a '.' (wrap's stand-ins start with one)", len(target))
		}
		if size := l.LinkSize(uint64(len(stored))); size != uint64(len(target)) {
			t.Fatalf("LinkSize(%d) = %d, want %d", len(stored), size, len(target))
		}
		got, err := l.DecodeLink(stored)
		if err != nil || !bytes.Equal(got, target) {
			t.Fatalf("DecodeLink(EncodeLink(%q)) = %q, %v", target, got, err)
		}
		if again, _ := l.EncodeLink(target); bytes.Equal(again, stored) {
			t.Fatal("two encodings of one target are equal: nonces repeat")
		}
	}
}

func TestLinkTamper(t *testing.T) {
	l := testLayer(t)
	stored, _ := l.EncodeLink([]byte("/etc/passwd"))
	for i := range stored {
		for _, c := range []byte{'A', 'B', '.', '='} {
			if stored[i] == c {
				continue
			}
			bad := bytes.Clone(stored)
			bad[i] = c
			if got, err := l.DecodeLink(bad); err == nil {
				t.Errorf("altered target %q decoded to %q", bad, got)
			}
		}
	}
	for _, bad := range [][]byte{nil, []byte("/etc/passwd"), stored[:len(stored)-1], append(bytes.Clone(stored), 'A')} {
		if got, err := l.DecodeLink(bad); err == nil {
			t.Errorf("DecodeLink(%q) = %q, want an error", bad, got)
		}
	}
}
