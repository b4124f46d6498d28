package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// A listing whose every entry is looked up as it is returned (the
// kernel's READDIRPLUS through go-fuse's bridge) has its names looked up
// ahead after the first miss: the later lookups are answered by the
// cache, several round trips at once instead of one after another. A
// listing without lookups sends none ahead.
func TestLookupsAhead(t *testing.T) {
	x := newExported(t, export.Options{})
	const files = 40
	os.Mkdir(filepath.Join(x.dir, "d"), 0o755)
	for i := range files {
		os.WriteFile(filepath.Join(x.dir, "d", fmt.Sprintf("f%02d", i)), []byte("x"), 0o644)
	}
	a := mountWith(t, x.dial, Options{})
	caching(t, a)
	d := lookup(t, a, "d")

	// READDIR alone: nothing looked up.
	names(t, d)
	if n := a.fs.Stats().LookupsAhead; n != 0 {
		t.Fatalf("a listing without lookups made %d lookups ahead", n)
	}
	// The cached listing would answer the next open: drop it, as a
	// change would.
	a.fs.cc.Drop(d.(*node).tok.Ino)

	s0 := a.fs.Stats()
	ds, e := d.OpenDir(bg)
	must(t, e, "opendir")
	looked := 0
	eachEntry(t, ds, func(ent layer.DirEntry) {
		var at layer.Attr
		if _, e := d.Lookup(bg, ent.Name, &at); e != 0 || at.Size != 1 {
			t.Fatalf("lookup %s: %v, size %d", ent.Name, e, at.Size)
		}
		looked++
	})
	ds.Close()
	s1 := a.fs.Stats()
	hits := s1.Hits["stat"] - s0.Hits["stat"]
	misses := s1.Misses["stat"] - s0.Misses["stat"]
	if looked != files || misses != 1 || hits != files-1 || s1.LookupsAhead != files-1 {
		t.Fatalf("%d lookups: %d missed, %d hit the cache, %d made ahead; want %d, 1 miss, %d hits, %d ahead",
			looked, misses, hits, s1.LookupsAhead, files, files-1, files-1)
	}

	// The kernel stops looking up after the first entry (it chooses
	// READDIRPLUS or READDIR each time): at most aheadWidth go ahead.
	a.fs.cc.Drop(d.(*node).tok.Ino)
	ds, e = d.OpenDir(bg)
	must(t, e, "opendir")
	first := true
	eachEntry(t, ds, func(ent layer.DirEntry) {
		if first {
			var at layer.Attr
			d.Lookup(bg, ent.Name, &at)
			first = false
		}
	})
	ds.Close()
	if n := a.fs.Stats().LookupsAhead - s1.LookupsAhead; n > aheadWidth {
		t.Fatalf("a listing looked up at its first entry only made %d lookups ahead, want at most %d", n, aheadWidth)
	}
}
