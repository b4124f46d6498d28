package remote

import (
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// delegated makes f with data on a fresh server that grants read
// delegations, and has client a open it for reading once: a holds its
// delegation from then on.
func delegated(t *testing.T, data string) (x *spriteServer, a *node, fa layer.Node) {
	t.Helper()
	x = newSpriteServer(t, export.Options{Delegate: true})
	a = spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, data)
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	// atime past every other time: reads do not move it (relatime), so
	// they are served from the cache, whatever the clock's granularity.
	now := time.Now()
	var out layer.Attr
	must(t, f.Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: now.Add(time.Hour), Mtime: now.Add(-time.Hour)}, &out), "utimes")
	h = open(t, f, unix.O_RDONLY)
	if got := readAll(t, h); got != data {
		t.Fatalf("a read %q, want %q", got, data)
	}
	h.Release(bg)
	if st := a.fs.Stats().Sprite; st.Delegations != 1 {
		t.Fatalf("a holds %d delegations after its open for reading, want 1", st.Delegations)
	}
	return x, a, f
}

func lopens(n *node) uint64 { return n.fs.Stats().Requests["lopen"] }

// readsBack opens f on client a for reading n times, each reading want,
// and returns the Tlopens it took.
func readsBack(t *testing.T, a *node, f layer.Node, n int, want string) uint64 {
	t.Helper()
	before := lopens(a)
	for range n {
		var at layer.Attr // as the kernel looks up what it opens: atime cached
		must(t, f.Getattr(bg, nil, &at), "getattr")
		h := open(t, f, unix.O_RDONLY)
		if got := readAll(t, h); got != want {
			t.Fatalf("read %q, want %q", got, want)
		}
		h.Release(bg)
	}
	return lopens(a) - before
}

// A client holding a read delegation opens the file for reading with no
// request, and reads it from its cache.
func TestDelegatedOpens(t *testing.T) {
	_, a, f := delegated(t, "hello")
	if n := readsBack(t, a, f, 5, "hello"); n != 0 {
		t.Fatalf("%d Tlopens for 5 delegated opens, want none", n)
	}
	if st := a.fs.Stats().Sprite; st.OpensDelegated != 5 {
		t.Fatalf("opens delegated: %d, want 5", st.OpensDelegated)
	}
}

// Another client's open for writing takes the delegation back first: a
// handle open under it opens on the server, so the file is write-shared
// (neither caches it), and what the writer writes the reader reads.
func TestDelegationReturnedToWriter(t *testing.T) {
	x, a, f := delegated(t, "old")
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "getattr")
	before := lopens(a)
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)
	if got := readAll(t, ha); got != "old" || lopens(a) != before {
		t.Fatalf("a read %q with %d Tlopens, want none: from its cache, the open delegated", got, lopens(a)-before)
	}
	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "f"), unix.O_WRONLY)
	write(t, hb, 0, "NEW")
	must(t, hb.Fsync(bg, false), "fsync")
	if got := readAll(t, ha); got != "NEW" {
		t.Fatalf("a's open handle read %q after b's write, want NEW", got)
	}
	hb.Release(bg)
	st := a.fs.Stats().Sprite
	if st.Returns != 1 || st.Uncaches != 1 {
		t.Fatalf("a's stats: returns %d, uncaches %d; want 1 and 1", st.Returns, st.Uncaches)
	}
	// Its next open asks the server again.
	before = lopens(a)
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	if got := readAll(t, h); got != "NEW" || lopens(a) == before {
		t.Fatalf("a's open after the return read %q with %d Tlopens", got, lopens(a)-before)
	}
}

// Two clients holding delegations, each with the file open under its
// own, give them back to a writer at once: each opens its handle on the
// server, and neither open may wait for the other's return (they did,
// and both gave up after the recall timeout).
func TestDelegationsReturnedByTwo(t *testing.T) {
	x, a, f := delegated(t, "old")
	b := spriteClient(t, x, "b", Options{})
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDONLY)
	if got := readAll(t, hb); got != "old" {
		t.Fatalf("b read %q", got)
	}
	hb.Release(bg)
	if st := b.fs.Stats().Sprite; st.Delegations != 1 {
		t.Fatalf("b holds %d delegations, want 1", st.Delegations)
	}
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "getattr")
	must(t, fb.Getattr(bg, nil, &at), "getattr")
	ha, hb := open(t, f, unix.O_RDONLY), open(t, fb, unix.O_RDONLY)
	defer ha.Release(bg)
	defer hb.Release(bg)
	c := spriteClient(t, x, "c", Options{})
	hc := open(t, lookup(t, c, "f"), unix.O_WRONLY)
	write(t, hc, 0, "NEW")
	must(t, hc.Fsync(bg, false), "fsync")
	hc.Release(bg)
	for _, h := range []layer.Handle{ha, hb} {
		if got := readAll(t, h); got != "NEW" {
			t.Fatalf("a holder's open handle read %q after c's write, want NEW", got)
		}
	}
	if n := serverCounter(t, x, "sprite.recall.timeouts"); n != 0 {
		t.Fatalf("the server gave up %d returns of clients that answered", n)
	}
	if ra, rb := a.fs.Stats().Sprite.Returns, b.fs.Stats().Sprite.Returns; ra != 1 || rb != 1 {
		t.Fatalf("returns: a %d, b %d; want 1 each", ra, rb)
	}
}

// serverCounter is a counter of x's stats file.
func serverCounter(t *testing.T, x *spriteServer, name string) uint64 {
	t.Helper()
	x.mu.Lock()
	srv := x.s
	x.mu.Unlock()
	v, _ := export.ParseStats(srv.Stats())
	n, ok := v[name]
	if !ok {
		t.Fatalf("no %s in the server's stats", name)
	}
	return n
}

// A rename over the file's name by another client takes the delegation
// back first: close-to-open holds for names, and a's open of the file by
// its old name fails (the kernel then looks the name up again).
func TestDelegationReturnedToRename(t *testing.T) {
	x, a, f := delegated(t, "old")
	b := spriteClient(t, x, "b", Options{})
	_, hb := create(t, b, "g")
	write(t, hb, 0, "new")
	must(t, hb.Fsync(bg, false), "fsync")
	hb.Release(bg)
	must(t, b.Rename(bg, "g", b, "f", 0), "rename g f")
	if _, e := f.Open(bg, unix.O_RDONLY); e != syscall.ESTALE {
		t.Fatalf("a's open of the replaced file: %v, want ESTALE", e)
	}
	h := open(t, lookup(t, a, "f"), unix.O_RDONLY)
	defer h.Release(bg)
	if got := readAll(t, h); got != "new" {
		t.Fatalf("a read %q after b's rename, want new", got)
	}
	if st := a.fs.Stats().Sprite; st.Returns != 1 {
		t.Fatalf("a returned %d delegations, want 1", st.Returns)
	}
}

// A truncation by another client through no open: the delegation goes
// with the change's record, which a applies before the truncation
// returns.
func TestDelegationDroppedByTruncate(t *testing.T) {
	x, _, f := delegated(t, "old")
	b := spriteClient(t, x, "b", Options{})
	var out layer.Attr
	must(t, lookup(t, b, "f").Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 1}, &out), "truncate")
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	if got := readAll(t, h); got != "o" {
		t.Fatalf("a read %q after b's truncation, want %q", got, "o")
	}
}

// A client that could not give its delegation back (cut off) is waited
// for until its lease; then the writer goes on.
func TestDelegationHolderGone(t *testing.T) {
	x := newSpriteServer(t, export.Options{Delegate: true, Lease: 200 * time.Millisecond})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, "old")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	open(t, f, unix.O_RDONLY).Release(bg)
	if st := a.fs.Stats().Sprite; st.Delegations != 1 {
		t.Fatalf("a holds %d delegations, want 1", st.Delegations)
	}
	x.setDown("a", true)
	x.cut("a")
	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "f"), unix.O_WRONLY)
	write(t, hb, 0, "NEW")
	hb.Release(bg)
	// While cut off, a opens nothing by its delegation.
	if _, e := f.Open(bg, unix.O_RDONLY); e == 0 {
		t.Fatal("a opened the file by its delegation while cut off")
	}
}

// The holder's own rename keeps its delegation on both sides: another
// client's open for writing after it still takes it back, and the
// holder's next open reads what that client wrote.
func TestDelegationKeptByOwnRename(t *testing.T) {
	x, a, f := delegated(t, "old")
	must(t, a.Rename(bg, "f", a, "g", 0), "rename f g")
	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "g"), unix.O_WRONLY)
	write(t, hb, 0, "NEW")
	must(t, hb.Fsync(bg, false), "fsync")
	hb.Release(bg)
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "getattr")
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	if got := readAll(t, h); got != "NEW" {
		t.Fatalf("a read %q after b's write, want NEW", got)
	}
	// Given back when b opened, not dropped at a's rename: otherwise a's
	// next open before its journal told it of b's write read "old".
	if st := a.fs.Stats().Sprite; st.Returns != 1 {
		t.Fatalf("a gave back %d delegations, want 1", st.Returns)
	}
}
