package remote

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/cache"
	"github.com/shalefs/shale/remote/writeback"
	"github.com/shalefs/shale/stack"
)

// testCache is a cache with a journal reader, as a client with a
// controller has them, and the events its records raise.
func testCache(t *testing.T) (*jreader, *cache.Cache, *[]layer.Event) {
	st := stack.New(stack.Options{CoherenceOff: true})
	var evs []layer.Event
	st.Events().Subscribe(func(ev layer.Event) { evs = append(evs, ev) })
	fs := &FS{st: st, live: map[uint64]liveTok{}}
	fs.cc = cache.New(100, cache.NewMemBlocks(1<<20))
	fs.cc.Live = fs.isLive
	fs.cc.On.Store(true)
	fs.jr = &jreader{fs: fs, uuid: newUUID()}
	fs.wb = writeback.New(writeback.Config{Cache: fs.cc, Delay: -1, Notice: fs.notice, GenOf: fs.genOf})
	return fs.jr, fs.cc, &evs
}

// fill caches a directory 1 with child 2 named "f", and 3 blocks of 2.
func fill(c *cache.Cache) {
	s := c.Snap()
	a := layer.Attr{Mode: 0o40755}
	c.PutAttr(s, 1, 1, &a)
	c.PutLookup(s, 1, "f", 0, 2, 1, &layer.Attr{Mode: 0o100644, Size: 2*cache.BlockSize + 5})
	c.PutLookup(s, 1, "gone", 0, 0, 0, nil)
	c.PutListing(s, 1, 0, []layer.DirEntry{{Name: "f", Off: 1}})
	c.PutData(s, 2, 1, 0, bytes.Repeat([]byte("x"), 2*cache.BlockSize+5), true)
}

func rec(seq uint64, path uint64, fs ...journal.Field) *journal.Record {
	return &journal.Record{Kind: journal.Change, Epoch: 7, Seq: seq, Qid: p9wire.Qid{Path: path}, Fields: fs}
}

func TestApplyRecords(t *testing.T) {
	j, c, evs := testCache(t)
	fill(c)
	buf := make([]byte, 3*cache.BlockSize)
	if k, ok := c.Read(2, 1, buf, 0); !ok || k != 2*cache.BlockSize+5 {
		t.Fatalf("read all: %d %v", k, ok)
	}
	// Data in the second block: that one and the last (short) go, the
	// first stays, and so do the directory's name and listing.
	j.apply(rec(1, 2, journal.Field{Type: journal.Data, Off: cache.BlockSize + 3, Len: 10}))
	if _, ok := c.Read(2, 1, buf[:10], 0); !ok {
		t.Error("block 0 dropped by a change in block 1")
	}
	if _, ok := c.Read(2, 1, buf[:10], cache.BlockSize); ok {
		t.Error("block 1 kept after a change in it")
	}
	if _, _, ok := c.Attr(2); ok {
		t.Error("attributes kept after a data change")
	}
	if _, ok := c.Listing(1, 0); !ok {
		t.Error("the directory's listing dropped by a file's data change")
	}
	// An entry: the name, the listing and the directory's attributes go;
	// the other name stays.
	j.apply(rec(2, 1, journal.Field{Type: journal.Entry, Op: journal.EntryRemoved, Name: "gone"}))
	if _, _, _, _, ok := c.Lookup(1, "gone", 0); ok {
		t.Error("negative entry kept after the name changed")
	}
	if _, ok := c.Listing(1, 0); ok {
		t.Error("listing kept after an entry changed")
	}
	if _, _, ok := c.Attr(1); ok {
		t.Error("directory attributes kept after an entry changed")
	}
	// A record of an older sequence is applied already.
	c.PutAttr(c.Snap(), 1, 1, &layer.Attr{Mode: 0o40755})
	j.apply(rec(2, 1, journal.Field{Type: journal.Attrs}))
	if _, _, ok := c.Attr(1); !ok {
		t.Error("a record read again dropped what was cached since")
	}
	// A field this reader does not know drops all of the QID.
	j.apply(rec(3, 2, journal.Field{Type: 99, Raw: []byte{1}}))
	if _, ok := c.Read(2, 1, buf[:10], 0); ok {
		t.Error("data kept after a record with an unknown field")
	}
	// Another epoch drops everything.
	j.apply(&journal.Record{Kind: journal.Change, Epoch: 8, Seq: 1, Qid: p9wire.Qid{Path: 5}, Fields: []journal.Field{{Type: journal.Attrs}}})
	if n, _ := c.Size(); n != 0 {
		t.Errorf("%d QIDs cached after a new epoch", n)
	}
	if len(*evs) == 0 || (*evs)[len(*evs)-1].Kind != layer.Everything {
		t.Errorf("events %v: want Everything last", *evs)
	}
	// A Reset drops everything.
	fill(c)
	j.apply(&journal.Record{Kind: journal.Reset, Epoch: 8, Seq: 2})
	if n, _ := c.Size(); n != 0 {
		t.Errorf("%d QIDs cached after a reset", n)
	}
}

// A fetch that began before a record and ends after it puts nothing.
func TestFetchRace(t *testing.T) {
	j, c, _ := testCache(t)
	s := c.Snap()
	j.apply(rec(1, 2, journal.Field{Type: journal.Attrs}))
	c.PutAttr(s, 2, 1, &layer.Attr{Size: 1})
	if _, _, ok := c.Attr(2); ok {
		t.Fatal("attributes read before a change were kept after its record")
	}
	c.PutAttr(s, 3, 1, &layer.Attr{Size: 1})
	if _, _, ok := c.Attr(3); !ok {
		t.Fatal("a record about another QID refused a put")
	}
	// A drop of everything refuses every fetch begun before it.
	s = c.Snap()
	c.DropAll()
	c.PutAttr(s, 4, 1, &layer.Attr{})
	if _, _, ok := c.Attr(4); ok {
		t.Fatal("a put begun before a drop of everything was kept")
	}
}

// A handle of a file removed on the server (open here, lazily: no fid
// holds it there) whose inode number another file took since reads
// neither that file's cached blocks nor its read grant: ext4 hands a
// freed inode number out again at once, with another generation.
func TestReusedInodeNumber(t *testing.T) {
	_, c, _ := testCache(t)
	fill(c) // path 2, generation 1: "x"s
	c.Grant(c.Snap(), 2, 0, 0, false)
	if !c.MayRead(2, 1, 0) {
		t.Fatal("no read grant for the file opened")
	}
	// The new file, generation 2, is looked up and read.
	s := c.Snap()
	c.PutLookup(s, 1, "g", 0, 2, 2, &layer.Attr{Mode: 0o100644, Size: 5})
	c.PutData(s, 2, 2, 0, []byte("yyyyy"), true)
	buf := make([]byte, 5)
	if k, ok := c.Read(2, 1, buf, 0); ok {
		t.Fatalf("the removed file's handle read the new file's data %q", buf[:k])
	}
	if c.MayRead(2, 1, 0) || c.MayRead(2, 2, 0) {
		t.Error("a read grant outlived its file")
	}
	if k, ok := c.Read(2, 2, buf, 0); !ok || string(buf[:k]) != "yyyyy" {
		t.Errorf("the new file's data: %q %v", buf[:k], ok)
	}
}

// Events for records name the live node's token, after the cache dropped.
func TestRecordEvents(t *testing.T) {
	j, c, evs := testCache(t)
	n := j.fs.newNode(layer.Token{Ino: 2, Gen: 9})
	fill(c)
	j.fs.st.Events().Subscribe(func(ev layer.Event) {
		if _, _, ok := c.Attr(2); ok && ev.Token.Ino == 2 {
			t.Error("event raised before the cache dropped")
		}
	})
	j.apply(rec(1, 2, journal.Field{Type: journal.Data, Off: 4, Len: 8}))
	if len(*evs) != 1 || (*evs)[0] != (layer.Event{Kind: layer.Data, Token: layer.Token{Ino: 2, Gen: 9}, Off: 4, Len: 8}) {
		t.Fatalf("events %+v", *evs)
	}
	n.Forget()
}

// caching waits until the client of root serves from its cache (its
// journal caught up).
func caching(t *testing.T, root *node) {
	t.Helper()
	for deadline := time.Now().Add(slow); !root.fs.cc.On.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client never caches")
		}
	}
}

// xattrReqs is the Txattrwalks a client sent.
func xattrReqs(n *node) uint64 { return n.fs.ctr.Reqs[p9wire.Txattrwalk].Load() }

// getx is Getxattr's answer as a string, or the errno's.
func getx(n layer.Node, ctx context.Context, name string) string {
	buf := make([]byte, 256)
	k, e := n.Getxattr(ctx, name, buf)
	if e != 0 {
		return e.Error()
	}
	return string(buf[:k])
}

// Extended attributes are cached, absent ones too, per uid the server
// answered; a record of another client's change, the client's own
// changes and a write drop what they make stale; the disk cache keeps
// them across a restart.
func TestXattrCache(t *testing.T) {
	x := newExported(t, export.Options{})
	os.WriteFile(filepath.Join(x.dir, "f"), []byte("data"), 0o600)
	dir := t.TempDir()
	a := mountWith(t, x.dial, Options{CacheDir: dir})
	b := mountWith(t, x.dial, Options{})
	caching(t, a)
	var at layer.Attr
	fa, e := a.Lookup(bg, "f", &at)
	must(t, e, "lookup")
	fb, e := b.Lookup(bg, "f", &at)
	must(t, e, "lookup")
	noData := syscall.ENODATA.Error()

	// An absent name and the list: asked once.
	for range 2 {
		if got := getx(fa, bg, "security.capability"); got != noData {
			t.Fatalf("security.capability: %s", got)
		}
		if k, e := fa.Listxattr(bg, nil); e != 0 || k != 0 {
			t.Fatalf("listxattr size: %d %v", k, e)
		}
	}
	if n := xattrReqs(a); n != 2 {
		t.Fatalf("%d Txattrwalks for an absent name and the list asked twice each, want 2", n)
	}

	// Another client sets one: its record drops ours.
	must(t, fb.Setxattr(bg, "user.k", []byte("v1"), 0), "setxattr through b")
	// Until it shows, and is served from the cache: a fetch that
	// crossed a record of the change is not kept.
	for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
		got := getx(fa, bg, "user.k")
		n := xattrReqs(a)
		if got == "v1" && getx(fa, bg, "user.k") == "v1" && xattrReqs(a) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("user.k set through another client: %s", got)
		}
	}
	before := xattrReqs(a)
	if k, e := fa.Getxattr(bg, "user.k", nil); e != 0 || k != 2 {
		t.Fatalf("size probe: %d %v", k, e)
	}
	if got := getx(fa, bg, "user.k"); got != "v1" {
		t.Fatalf("user.k: %s", got)
	}
	if _, e := fa.Getxattr(bg, "user.k", make([]byte, 1)); e != syscall.ERANGE {
		t.Fatalf("a short buffer: %v", e)
	}
	if n := xattrReqs(a) - before; n != 0 {
		t.Fatalf("%d Txattrwalks for a cached value", n)
	}

	// Another uid is not served what root was.
	nobody := as(65534, 65534, 0)
	getx(fa, nobody, "user.k")
	if n := xattrReqs(a) - before; n != 1 {
		t.Fatalf("%d Txattrwalks for a uid the server did not answer yet, want 1", n)
	}

	// Our own change shows at once. A write on the server kills
	// security.capability: the cached one goes, with the list that
	// names it; the rest stays.
	must(t, fa.Setxattr(bg, "user.k", []byte("v2"), 0), "setxattr")
	if got := getx(fa, bg, "user.k"); got != "v2" {
		t.Fatalf("after our own setxattr: %s", got)
	}
	capV2 := []byte{0, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // CAP_NET_BIND_SERVICE
	must(t, fa.Setxattr(bg, "security.capability", capV2, 0), "set security.capability")
	if got := getx(fa, bg, "security.capability"); got != string(capV2) {
		t.Fatalf("security.capability: %q", got)
	}
	fa.Listxattr(bg, make([]byte, 256))
	getx(fa, bg, "user.k")
	h, e := fa.Open(bg, unix.O_WRONLY)
	must(t, e, "open")
	_, e = h.Write(bg, []byte("more"), 4)
	must(t, e, "write")
	h.Release(bg)
	before = xattrReqs(a)
	if got := getx(fa, bg, "user.k"); got != "v2" {
		t.Fatalf("user.k after a write: %s", got)
	}
	if n := xattrReqs(a) - before; n != 0 {
		t.Fatalf("%d Txattrwalks for user.k after a write", n)
	}
	if got := getx(fa, bg, "security.capability"); got != noData {
		t.Fatalf("security.capability after a write: %q, want it gone", got)
	}
	buf := make([]byte, 256)
	if k, e := fa.Listxattr(bg, buf); e != 0 || bytes.Contains(buf[:k], []byte("security.capability")) {
		t.Fatalf("listxattr after a write: %q %v", buf[:k], e)
	}
	if n := xattrReqs(a) - before; n != 2 {
		t.Fatalf("%d Txattrwalks for security.capability and the list after a write, want 2", n)
	}
	must(t, fa.Removexattr(bg, "user.k"), "removexattr")
	if got := getx(fa, bg, "user.k"); got != noData {
		t.Fatalf("after our own removexattr: %s", got)
	}

	// A restart with the disk cache answers from it.
	getx(fa, bg, "user.k")
	getx(fa, bg, "security.capability")
	fa.Forget()
	a.Close()
	a = mountWith(t, x.dial, Options{CacheDir: dir})
	caching(t, a)
	fa, e = a.Lookup(bg, "f", &at)
	must(t, e, "lookup after the restart")
	if got := getx(fa, bg, "user.k"); got != noData {
		t.Fatalf("user.k after the restart: %s", got)
	}
	if got := getx(fa, bg, "security.capability"); got != noData {
		t.Fatalf("security.capability after the restart: %s", got)
	}
	if n := xattrReqs(a); n != 0 {
		t.Fatalf("%d Txattrwalks after a restart with the disk cache", n)
	}
}

// A file opened for reading from the cache (no Tlopen) and then removed
// on the server stays readable, as an open file does: its reads that the
// relatime rule would send to the server (the removal's record dropped
// its attributes) are served from the cache when the server can no
// longer open it, rather than failing with ESTALE.
func TestLazyOpenRemoved(t *testing.T) {
	x := newExported(t, export.Options{})
	os.WriteFile(filepath.Join(x.dir, "f"), []byte("data"), 0o644)
	a := mountWith(t, x.dial, Options{})
	b := mountWith(t, x.dial, Options{})
	caching(t, a)
	var at layer.Attr
	f1, e := a.Lookup(bg, "f", &at)
	must(t, e, "lookup")
	buf := make([]byte, 16)
	for range 2 { // the second read moves no atime: cached
		h, e := f1.Open(bg, unix.O_RDONLY)
		must(t, e, "open")
		if k, e := h.Read(bg, buf, 0); e != 0 || string(buf[:k]) != "data" {
			t.Fatalf("read: %q %v", buf[:k], e)
		}
		h.Release(bg)
		f1.Getattr(bg, nil, &at)
	}
	// A lookup answered by the cache gives a node with no fid; its open
	// for reading sends nothing.
	f2, e := a.Lookup(bg, "f", &at)
	must(t, e, "lookup again")
	h, e := f2.Open(bg, unix.O_RDONLY)
	must(t, e, "open again")
	defer h.Release(bg)
	must(t, b.Unlink(bg, "f"), "unlink through another client")
	for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
		if _, _, ok := a.fs.cc.Attr(f2.(*node).tok.Ino); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the removal never dropped the attributes")
		}
	}
	if k, e := h.Read(bg, buf, 0); e != 0 || string(buf[:k]) != "data" {
		t.Fatalf("read of the open file removed on the server: %q %v", buf[:k], e)
	}
}

// oldAtimeFile is file f (p on the server) holding "data", its atime and
// mtime old (an hour ago, whole seconds), looked up on a caching client a.
func oldAtimeFile(t *testing.T) (p string, old time.Time, a *node, f layer.Node) {
	t.Helper()
	x := newExported(t, export.Options{})
	p = filepath.Join(x.dir, "f")
	os.WriteFile(p, []byte("data"), 0o644)
	old = time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(p, old, old)
	a = mountWith(t, x.dial, Options{})
	caching(t, a)
	return p, old, a, lookup(t, a, "f")
}

// A read that moves a file's atime on the server (relatime: atime not
// after mtime) moves the cached one too, rather than dropping the
// attributes: the next lookup of the file is answered from the cache,
// with an atime after mtime that the server's stat confirms (one clock
// here). Before, every source file a build read was walked to and
// stat'd again at the directory's next READDIRPLUS.
func TestReadMovesCachedAtime(t *testing.T) {
	p, old, a, f := oldAtimeFile(t)
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "stat")
	if at.Atime.After(at.Mtime) {
		t.Fatalf("atime %v after mtime %v before the read", at.Atime, at.Mtime)
	}
	h, e := f.Open(bg, unix.O_RDONLY)
	must(t, e, "open")
	before := time.Now()
	buf := make([]byte, 16)
	if k, e := h.Read(bg, buf, 0); e != 0 || string(buf[:k]) != "data" {
		t.Fatalf("read: %q %v", buf[:k], e)
	}
	h.Release(bg)
	walks := a.fs.ctr.Reqs[p9wire.Twalk].Load()
	getattrs := a.fs.ctr.Reqs[p9wire.Tgetattr].Load()
	if _, e := a.Lookup(bg, "f", &at); e != 0 {
		t.Fatalf("lookup after the read: %v", e)
	}
	if w, g := a.fs.ctr.Reqs[p9wire.Twalk].Load()-walks, a.fs.ctr.Reqs[p9wire.Tgetattr].Load()-getattrs; w+g != 0 {
		t.Fatalf("lookup after the read sent %d Twalks and %d Tgetattrs, want none", w, g)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	server := time.Unix(st.Atim.Unix())
	if !at.Atime.After(at.Mtime) || at.Atime.Before(before) || at.Atime.Before(server) {
		t.Fatalf("cached atime %v: want after mtime %v, after the read's start %v and not before the server's %v", at.Atime, at.Mtime, before, server)
	}
	if !server.After(old.Add(time.Minute)) {
		t.Fatalf("the server's atime %v did not move from %v", server, old)
	}
}

// A read through a handle opened with O_NOATIME moves no atime on the
// server (crypt's reads of a block it rewrites): stat shows the old one,
// not a time the client made up.
func TestNoatimeReadKeepsAtime(t *testing.T) {
	_, old, _, f := oldAtimeFile(t)
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "stat")
	h, e := f.Open(bg, unix.O_RDONLY|unix.O_NOATIME)
	must(t, e, "open")
	buf := make([]byte, 16)
	if k, e := h.Read(bg, buf, 0); e != 0 || string(buf[:k]) != "data" {
		t.Fatalf("read: %q %v", buf[:k], e)
	}
	h.Release(bg)
	must(t, f.Getattr(bg, nil, &at), "stat")
	if !at.Atime.Equal(old) {
		t.Fatalf("atime %v after an O_NOATIME read, want %v", at.Atime, old)
	}
}
