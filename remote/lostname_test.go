package remote

import (
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/writeback"
)

// TestNameOpsLostReply: a rename or an unlink that the server makes but
// whose reply the connection loses is found made on the next connection
// (the server fences the lost one first), not failed. Failed, the
// client kept its old names: the soak's write-backs by age then walked a
// name that was another file's now, and kept the data of the file the
// rename had replaced in conflict copies ("another client removed or
// renamed the file", walk="stale file handle"), and reads of the old
// name were answered from the cache.
func TestNameOpsLostReply(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{Timeout: 10 * time.Second})
	f, h := create(t, a, "f")
	write(t, h, 0, "moved") // delayed
	h.Release(bg)
	_, hg := create(t, a, "g")
	write(t, hg, 0, "replaced") // delayed, then renamed over
	hg.Release(bg)

	x.lose.Store(p9wire.Trenameat + 1)
	e := a.Rename(bg, "f", a, "g", 0)
	if x.lose.Load() != 0 {
		t.Fatal("the rename's reply was never lost: the test tests nothing")
	}
	if e != 0 {
		t.Fatalf("a rename the server made, its reply lost: %v, want it found made", e)
	}
	var out layer.Attr
	if ch, e := a.Lookup(bg, "g", &out); e != 0 || ch.Token() != f.Token() {
		t.Fatalf("after the rename, g is %v (%v), want the moved file %v", ch, e, f.Token())
	}
	if _, e := a.Lookup(bg, "f", &out); e != syscall.ENOENT {
		t.Fatalf("after the rename, f looks up with %v, want ENOENT", e)
	}
	a.fs.wb.WriteBackAll(bg, writeback.Fsync)
	if got := x.onServer(t, "g"); got != "moved" {
		t.Fatalf("the server's g holds %q, want %q", got, "moved")
	}

	x.lose.Store(p9wire.Tunlinkat + 1)
	if e := a.Unlink(bg, "g"); e != 0 {
		t.Fatalf("an unlink the server made, its reply lost: %v, want it found made", e)
	}
	if x.lose.Load() != 0 {
		t.Fatal("the unlink's reply was never lost: the test tests nothing")
	}
	if _, e := a.Lookup(bg, "g", &out); e != syscall.ENOENT {
		t.Fatalf("after the unlink, g looks up with %v, want ENOENT", e)
	}
	if n := a.fs.wb.Ctr.Lost.Load(); n != 0 {
		t.Fatalf("%d bytes kept in conflict copies, want none", n)
	}
}
