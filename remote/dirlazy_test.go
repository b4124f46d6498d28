package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// eachEntry reads ds to its end, calling fn with each entry but "." and
// "..", as it is read.
func eachEntry(t *testing.T, ds layer.DirStream, fn func(layer.DirEntry)) {
	t.Helper()
	for {
		ent, ok, e := ds.Next(bg)
		must(t, e, "readdir")
		if !ok {
			return
		}
		if ent.Name != "." && ent.Name != ".." {
			fn(ent)
		}
	}
}

// drain reads ds to its end: its entries but "." and "..".
func drain(t *testing.T, ds layer.DirStream) []layer.DirEntry {
	t.Helper()
	var all []layer.DirEntry
	eachEntry(t, ds, func(ent layer.DirEntry) { all = append(all, ent) })
	return all
}

// names lists d through a new stream, sorted.
func names(t *testing.T, d layer.Node) []string {
	t.Helper()
	ds, e := d.OpenDir(bg)
	must(t, e, "opendir")
	ents := drain(t, ds)
	ds.Close()
	ns := make([]string, len(ents))
	for i, ent := range ents {
		ns[i] = ent.Name
	}
	slices.Sort(ns)
	return ns
}

// mkdir makes name in dir.
func mkdir(t *testing.T, dir layer.Node, name string) layer.Node {
	t.Helper()
	var at layer.Attr
	d, e := dir.Mkdir(bg, name, 0o755, &at)
	must(t, e, "mkdir %s", name)
	return d
}

// listedDir is client a of a new server with directory d holding x, its
// atime and mtime set that far from now, listed once.
func listedDir(t *testing.T, atime, mtime time.Duration) (*spriteServer, *node, layer.Node) {
	t.Helper()
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	_, h := create(t, d, "x")
	h.Release(bg)
	now := time.Now()
	var at layer.Attr
	must(t, d.Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: now.Add(atime), Mtime: now.Add(mtime)}, &at), "utimes")
	if got := names(t, d); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("a listed %q", got)
	}
	return x, a, d
}

// A listing that moves the directory's atime (relatime: atime not after
// mtime) is cached all the same, and a later open of the directory that
// lists nothing (a kernel listing from its own cache) sends no request;
// one that lists reads the server, and shows another client's new name.
// Before, the atime's drop refused the listing, and every open of such a
// directory was a walk, a Tlopen and a clunk.
func TestDirOpenWithoutListing(t *testing.T) {
	x, a, d := listedDir(t, -time.Hour, 0)
	// The listing moved the cached atime past mtime: as if the server
	// had answered one not after it, the next listing would move it.
	dn := d.(*node)
	at, gen, ok := a.fs.cc.Attr(dn.tok.Ino)
	if !ok || !at.Atime.After(at.Mtime) {
		t.Fatalf("after the listing: attributes cached %v, atime %v, mtime %v", ok, at.Atime, at.Mtime)
	}
	at.Atime = at.Mtime.Add(-time.Hour)
	a.fs.cc.PutAttr(a.fs.cc.Snap(), dn.tok.Ino, gen, &at)
	before := lopens(a)
	for range 3 {
		ds, e := d.OpenDir(bg)
		must(t, e, "opendir")
		ds.Close()
	}
	if n := lopens(a) - before; n != 0 {
		t.Fatalf("3 opens of a listed directory that read nothing sent %d Tlopens, want none", n)
	}
	if n := a.fs.Stats().DirOpensUnsent; n != 3 {
		t.Fatalf("dir_opens_unsent %d, want 3", n)
	}
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, lookup(t, b, "d"), "y")
	h.Release(bg)
	if got := names(t, d); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("a listed %q after b's create, want [x y]", got)
	}
}

// A listing opened from the cache but read after a change reached the
// client reads the server: the kernel, told of the change between its
// OPENDIR and its READDIR, fetches the new mtime first, and would keep
// the listing taken at the open as the one of that mtime. Before, the
// stream served it (TestCacheTwoClients: 20 s of a listing without
// another client's new file).
func TestCachedListingOpenedBeforeChange(t *testing.T) {
	// atime after mtime and ctime: listing it moves nothing, so the
	// second listing is served from the cache.
	x, a, d := listedDir(t, time.Hour, -time.Hour)
	names(t, d)
	hits := a.fs.Stats().Hits[kindNames[kindDir]]
	ds, e := d.OpenDir(bg)
	must(t, e, "opendir")
	defer ds.Close()
	if a.fs.Stats().Hits[kindNames[kindDir]] == hits {
		t.Fatal("the open was not served from the cache: the test tests nothing")
	}
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, lookup(t, b, "d"), "y")
	h.Release(bg)
	ino := d.(*node).tok.Ino
	for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := a.fs.cc.Listing(ino, 0); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's create never reached a")
		}
	}
	var got []string
	for _, ent := range drain(t, ds) {
		got = append(got, ent.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("a stream opened before b's create, read after a learnt of it, listed %q, want [x y]", got)
	}
}

// A cached listing whose reading moves the directory's atime (relatime)
// moves it on the server with one Treaddir and lists the rest from the
// cache: walk, Tlopen, Treaddir and clunk. Before, it read the whole
// listing again, a second Treaddir to learn of its end (issue 27's hot
// build lists its build directory so).
func TestCachedListingMovesAtime(t *testing.T) {
	x, a, d := listedDir(t, -time.Hour, 0)
	// Set the atime back behind mtime, on the server's disk (beside it:
	// nothing tells a) and in a's cache: the next listing moves it.
	ino := d.(*node).tok.Ino
	at, gen, ok := a.fs.cc.Attr(ino)
	if !ok {
		t.Fatal("d's attributes are not cached after its listing")
	}
	old := at.Mtime.Add(-time.Hour)
	path := filepath.Join(x.dir, "d")
	ts := []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), {Nsec: unix.UTIME_OMIT}}
	if err := unix.UtimesNano(path, ts); err != nil {
		t.Fatal(err)
	}
	at.Atime = old
	a.fs.cc.PutAttr(a.fs.cc.Snap(), ino, gen, &at)
	if _, ok := a.fs.cc.Listing(ino, 0); !ok || !a.fs.cc.Touches(ino) {
		t.Fatalf("listing cached %v, atime to move %v: the test tests nothing", ok, a.fs.cc.Touches(ino))
	}
	req := func() map[string]uint64 { return a.fs.Stats().Requests }
	before := req()
	if got := names(t, d); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("a listed %q, want [x]", got)
	}
	after := req()
	for _, r := range []string{"walk", "lopen", "readdir", "clunk"} {
		if n := after[r] - before[r]; n != 1 {
			t.Errorf("the listing sent %d T%s, want 1", n, r)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if srv := time.Unix(st.Atim.Unix()); !srv.After(old) {
		t.Errorf("the server's atime %v did not move from %v", srv, old)
	}
	if at, _, ok := a.fs.cc.Attr(ino); ok && !at.Atime.After(at.Mtime) {
		t.Errorf("the cached atime %v did not move past mtime %v", at.Atime, at.Mtime)
	}
	if a.fs.cc.Touches(ino) {
		t.Error("the next listing would move the atime again")
	}
	// Listed again: from the cache alone.
	before = req()
	names(t, d)
	if n := req()["readdir"] - before["readdir"]; n != 0 {
		t.Errorf("a second listing sent %d Treaddirs, want none", n)
	}
}

// shale's server fills its Rreaddirs (journal.FillsReaddir): a listing
// that fits one reply is one Treaddir, not two, the second to learn of
// the end; one of many replies is whole, every name once.
func TestListingEndsShort(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	for _, d := range []string{"small", "big"} {
		if err := os.Mkdir(filepath.Join(x.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 3 {
		name := fmt.Sprintf("f%d", i)
		os.WriteFile(filepath.Join(x.dir, "small", name), nil, 0o644)
	}
	long := strings.Repeat("x", 240)
	for i := range 6000 {
		name := fmt.Sprintf("%s%05d", long, i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(x.dir, "big", name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := spriteClient(t, x, "a", Options{})
	readdirs := func() uint64 { return a.fs.Stats().Requests["readdir"] }
	before := readdirs()
	if got := names(t, lookup(t, a, "small")); len(got) != 3 {
		t.Fatalf("listed %q, want 3 names", got)
	}
	if n := readdirs() - before; n != 1 {
		t.Errorf("a listing of 3 names sent %d Treaddirs, want 1", n)
	}
	before = readdirs()
	if got := names(t, lookup(t, a, "big")); !slices.Equal(got, want) {
		t.Fatalf("listed %d names of 6000 long ones", len(got))
	}
	if n := readdirs() - before; n < 2 {
		t.Errorf("6000 long names took %d Treaddirs: the test tests nothing", n)
	}
}
