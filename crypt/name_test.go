package crypt

import (
	"errors"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"
)

func TestNameRoundTrip(t *testing.T) {
	l := testLayer(t)
	r := rand.New(rand.NewPCG(7, 8))
	dir := randBytes(r, dirIDSize)
	names := []string{
		"a", "...", ".hidden", "shale.conf", ".shale.dirid", "ünïcødé ☃ 名前",
		"tab\tnew\nline", "\xff\xfe not utf-8", strings.Repeat("x", maxNameLen),
		strings.Repeat("é", maxNameLen/2), strings.Repeat("名", maxNameLen/3),
	}
	for range 300 {
		// Random bytes, without '/' and NUL.
		b := randBytes(r, 1+r.IntN(maxNameLen))
		for i := range b {
			if b[i] == '/' || b[i] == 0 {
				b[i] = 'z'
			}
		}
		names = append(names, string(b))
	}
	for _, name := range names {
		enc, err := l.EncodeName(dir, name)
		if err != nil {
			t.Fatalf("EncodeName(%q): %v", name, err)
		}
		if enc[0] == '.' || strings.ContainsAny(enc, "/\x00") || !utf8.ValidString(enc) {
			t.Fatalf("EncodeName(%q) = %q: not a safe lower name", name, enc)
		}
		if again, _ := l.EncodeName(dir, name); again != enc {
			t.Fatalf("EncodeName(%q) is not deterministic", name)
		}
		got, err := l.DecodeName(dir, enc)
		if err != nil || got != name {
			t.Fatalf("DecodeName(EncodeName(%q)) = %q, %v", name, got, err)
		}
	}
	// Longest plaintext name: the template stores the result under a
	// hashed short name; it must still be returned in full.
	long, _ := l.EncodeName(dir, strings.Repeat("x", maxNameLen))
	if len(long) != nameEncoding.EncodedLen(sivTagSize+maxNameLen) {
		t.Errorf("a %d-byte name encodes to %d bytes", maxNameLen, len(long))
	}
}

func TestNameRefusals(t *testing.T) {
	l := testLayer(t)
	for _, name := range []string{"", ".", "..", "a/b", "a\x00b"} {
		if _, err := l.EncodeName(nil, name); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("EncodeName(%q) = %v, want EINVAL", name, err)
		}
	}
	if _, err := l.EncodeName(nil, strings.Repeat("x", maxNameLen+1)); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("EncodeName of %d bytes = %v, want ENAMETOOLONG", maxNameLen+1, err)
	}
}

// A lower name decodes only in its own directory, unaltered, under its
// own key; everything else is hidden, never shown under another name.
func TestNameTamper(t *testing.T) {
	l := testLayer(t)
	dirA, dirB := []byte("directory A ID.."), []byte("directory B ID..")
	enc, _ := l.EncodeName(dirA, "secret.txt")
	if _, err := l.DecodeName(dirB, enc); err == nil {
		t.Error("a name decoded in another directory")
	}
	if _, err := l.DecodeName(nil, enc); err == nil {
		t.Error("a name decoded without its directory ID")
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range enc {
		for _, c := range []byte{alphabet[(strings.IndexByte(alphabet, enc[i])+1)%64], '.', '=', '+'} {
			bad := enc[:i] + string(c) + enc[i+1:]
			if got, err := l.DecodeName(dirA, bad); err == nil {
				t.Errorf("altered name %q decoded to %q", bad, got)
			}
		}
	}
	for _, lower := range []string{"", ".", "..", ".shale.dirid", "shale.conf", enc[:len(enc)-1], enc + "A", enc + "AA"} {
		if got, err := l.DecodeName(dirA, lower); err == nil {
			t.Errorf("DecodeName(%q) = %q, want an error", lower, got)
		}
	}
	l2, _ := newLayer(make([]byte, masterKeySize), 1)
	if _, err := l2.DecodeName(dirA, enc); err == nil {
		t.Error("a name decoded under another master key")
	}
}
