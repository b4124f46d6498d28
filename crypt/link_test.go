package crypt

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
)

func TestLinkRoundTrip(t *testing.T) {
	l := testLayer(t)
	r := rand.New(rand.NewPCG(9, 10))
	targets := [][]byte{{}, []byte("/"), []byte("../a/b"), []byte("ünï/☃"), bytes.Repeat([]byte("a/"), maxLinkLen/2), bytes.Repeat([]byte("x"), maxLinkLen)}
	for range 100 {
		targets = append(targets, randBytes(r, r.IntN(maxLinkLen+1)))
	}
	for _, target := range targets {
		stored, err := l.EncodeLink(target)
		if err != nil {
			t.Fatalf("EncodeLink(%d bytes): %v", len(target), err)
		}
		if len(stored) > maxStoredLink || bytes.IndexByte(stored, 0) >= 0 {
			t.Fatalf("EncodeLink(%d bytes) stored %d bytes, at most %d without NUL", len(target), len(stored), maxStoredLink)
		}
		got, err := l.DecodeLink(stored)
		if err != nil || !bytes.Equal(got, target) {
			t.Fatalf("DecodeLink(EncodeLink(%q)) = %q, %v", target, got, err)
		}
		if again, _ := l.EncodeLink(target); bytes.Equal(again, stored) {
			t.Fatal("two encodings of one target are equal: nonces repeat")
		}
	}
	_, err := l.EncodeLink(make([]byte, maxLinkLen+1))
	if !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("EncodeLink of %d bytes = %v, want ENAMETOOLONG", maxLinkLen+1, err)
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
