package remote

import (
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// A client that has a file open for writing, no other client having it
// open, holds a delegation from that open: it reads the file back (a
// build's output) without a Tlopen. Another client's open for reading
// sees its delayed writes; one for writing takes the delegation back,
// and the holder's open handle reads what the other wrote.
func TestDelegationToWriter(t *testing.T) {
	x := newSpriteServer(t, export.Options{Delegate: true})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, "one")
	h.Release(bg)
	// atime past every other time: reads are served from the cache.
	now := time.Now()
	var out layer.Attr
	must(t, f.Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: now.Add(time.Hour), Mtime: now.Add(-time.Hour)}, &out), "utimes")
	hw := open(t, f, unix.O_RDWR)
	defer hw.Release(bg)
	write(t, hw, 0, "two")
	if n := readsBack(t, a, f, 3, "two"); n != 0 {
		t.Fatalf("%d Tlopens for 3 opens for reading of a file a alone writes, want none", n)
	}
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)

	b := spriteClient(t, x, "b", Options{})
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDONLY)
	if got := readAll(t, hb); got != "two" {
		t.Fatalf("b read %q, want a's delayed two", got)
	}
	hb.Release(bg)
	hb = open(t, fb, unix.O_WRONLY)
	write(t, hb, 0, "NEW")
	must(t, hb.Fsync(bg, false), "fsync")
	hb.Release(bg)
	if got := readAll(t, ha); got != "NEW" {
		t.Fatalf("a's open handle read %q after b's write, want NEW", got)
	}
	if st := a.fs.Stats().Sprite; st.Returns != 1 {
		t.Fatalf("a returned %d delegations, want 1", st.Returns)
	}
	if n := serverCounter(t, x, "sprite.recall.timeouts"); n != 0 {
		t.Fatalf("the server gave up %d recalls or returns", n)
	}
}

// A stat through a handle a delegation opened without a request (the
// kernel's GETATTR of an open file: fstat) asks through the node's fid:
// before, it opened the handle on the server for it (a walk, a Tlopen
// and a clunk besides the Tgetattr: grep -r's warm run sent four
// requests a file).
func TestDelegatedHandleStat(t *testing.T) {
	_, a, f := delegated(t, "hello")
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	a.fs.cc.DropAttrs(f.Token().Ino)
	before := lopens(a)
	var at layer.Attr
	must(t, f.Getattr(bg, h, &at), "getattr")
	if at.Size != 5 {
		t.Fatalf("size %d, want 5", at.Size)
	}
	if n := lopens(a) - before; n != 0 {
		t.Fatalf("a stat through a delegated handle sent %d Tlopens, want none", n)
	}
	if got := readAll(t, h); got != "hello" {
		t.Fatalf("read %q after the stat", got)
	}
}

// The creator of a file reads it back without asking the server (a
// build's output, read for its build ID): the server made the file as
// the creator, whose access is the mode's owner bits. Another user's
// open still asks, and the server refuses it.
func TestCreatorReadsBack(t *testing.T) {
	x := newSpriteServer(t, export.Options{Delegate: true})
	a := spriteClient(t, x, "a", Options{})
	var at layer.Attr
	f, h, e := a.Create(bg, "f", unix.O_WRONLY|unix.O_TRUNC, 0o600, &at)
	must(t, e, "create")
	write(t, h, 0, "one")
	h.Release(bg)
	if n := readsBack(t, a, f, 2, "one"); n != 0 {
		t.Fatalf("%d Tlopens for 2 opens for reading by the file's creator, want none", n)
	}
	if _, e := f.Open(as(65534, 65534, 0o022), unix.O_RDONLY); e != syscall.EACCES {
		t.Fatalf("another user's open for reading of a mode 0600 file: %v, want EACCES", e)
	}
}
