package coherence

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// compressChecks mount a compress view over a crypt view of one stack and
// change a file through each in turn, after the other's kernel, holding
// names, attributes and pages for an hour, has cached it. compress keeps
// the lower token and widens Data events to the whole file; the crypt
// view shows compress's stored form, which starts with its magic, and a
// file written there is plain to compress, served as it is.
func compressChecks(t *testing.T, coherence string) map[string]bool {
	defer patient(coherence)()
	_, m := mountLayers(t, coherence, []string{"crypt", "compress"}, 1, 2)
	enc, zip := filepath.Join(m[0], "f"), filepath.Join(m[1], "f")
	held := map[string]bool{}
	check := func(name string, f func() string, want string) {
		got, w := eventually(f, want)
		held[name] = got == w
		if got != w {
			t.Logf("%s (coherence %s): got %q, want %q", name, coherence, got, w)
		}
	}
	write := func(p string, b []byte) {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	magic := func() string { return fmtBool(strings.HasPrefix(read(enc), "\x89SHZ\r\n\x1a\n")) }

	write(enc, []byte("plain, written beneath"))
	read(zip) // now in the compress view's page cache
	write(enc, []byte("plain, rewritten beneath"))
	check("a plain file rewritten beneath reads anew above", func() string { return read(zip) }, "plain, rewritten beneath")
	size(zip)
	if err := os.Truncate(enc, 0); err != nil {
		t.Fatal(err)
	}
	check("truncated beneath, empty above", func() string { return size(zip) }, "0")
	read(enc)
	write(zip, []byte(strings.Repeat("compress over crypt ", 100)))
	check("written above, stored compressed beneath", magic, "true")
	before := size(enc)
	random := make([]byte, 5000)
	rand.Read(random)
	write(zip, random)
	check("rewritten above, a new stored size beneath", func() string { return fmtBool(size(enc) != before) }, "true")
	check("and the new content above", func() string { return fmtBool(read(zip) == string(random)) }, "true")
	return held
}

func fmtBool(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestCompressViewsAreCoherent(t *testing.T) {
	for name, ok := range compressChecks(t, "on") {
		if !ok {
			t.Errorf("%s: stale with the manager on", name)
		}
	}
}

// Without the manager some of the same checks go stale: the checks see
// what coherence does.
func TestCompressViewsWithoutCoherenceGoStale(t *testing.T) {
	stale := 0
	for _, ok := range compressChecks(t, "off") {
		if !ok {
			stale++
		}
	}
	if stale == 0 {
		t.Error("every check held without the manager: they do not test coherence")
	}
}
