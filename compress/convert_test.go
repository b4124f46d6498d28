package compress

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Convert compresses plain files in place, keeping content, mode and
// times; it skips files already compressed, empty and hard-linked ones,
// removes what an interrupted run left, and a second run changes nothing.
func TestConvert(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a/b"), 0o755)
	text := bytes.Repeat([]byte("convert me in place, please\n"), 10000)
	files := map[string][]byte{"top": []byte("small"), "a/b/big": text, "a/empty": nil, "a/linked": []byte("two names")}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	os.Link(filepath.Join(dir, "a/linked"), filepath.Join(dir, "a/link2"))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(dir, "a/b/big"), mtime, mtime)
	os.WriteFile(filepath.Join(dir, "a/.top"+tmpSuffix), []byte("leftover"), 0o600)
	var last Progress
	if err := Convert(ctx, dir, func(p Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	if last.Files != 2 || last.Skipped != 2 || last.TotalFiles != 4 || last.Bytes != int64(5+len(text)) || last.Stored >= last.Bytes/10 {
		t.Errorf("progress at the end: %+v", last)
	}
	if _, err := os.Stat(filepath.Join(dir, "a/.top"+tmpSuffix)); !os.IsNotExist(err) {
		t.Errorf("a leftover temporary is still there (%v)", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "a/b/big"))
	if !bytes.HasPrefix(b, magic[:]) || len(b) > len(text)/10 {
		t.Errorf("a/b/big is not stored compressed: %d bytes", len(b))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a/linked")); string(b) != "two names" {
		t.Errorf("a hard-linked file was changed: %q", b)
	}
	fi, _ := os.Stat(filepath.Join(dir, "a/b/big"))
	if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
		t.Errorf("a/b/big has mode %v, mtime %v; want 0640, %v", fi.Mode(), fi.ModTime(), mtime)
	}
	for name, data := range files {
		checkFresh(t, dir, name, data)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "top"))
	if err := Convert(ctx, dir, func(p Progress) {
		if p.SkipReason == "" {
			t.Errorf("a second run converts %s", p.Path)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "top")); !bytes.Equal(before, after) {
		t.Error("a second run rewrote a converted file")
	}
}
