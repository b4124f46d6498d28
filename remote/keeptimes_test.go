package remote

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// reqs is the count of requests a has sent.
func reqs(a *node) uint64 {
	var n uint64
	for i := range a.fs.ctr.Reqs {
		n += a.fs.ctr.Reqs[i].Load()
	}
	return n
}

// delayedFile is client a of a new server, and f, which a wrote data to
// and holds delayed, its attributes cached (as the kernel's stat leaves
// them).
func delayedFile(t *testing.T, data string) (x *spriteServer, a *node, f layer.Node) {
	t.Helper()
	x = newSpriteServer(t, export.Options{})
	a = spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, data)
	h.Release(bg)
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "stat")
	return x, a, f
}

// keptUtimes sets f's times (zero: left alone) as its owner, and fails
// the test if that sent a request.
func keptUtimes(t *testing.T, a *node, f layer.Node, atime, mtime time.Time) layer.Attr {
	t.Helper()
	in := layer.SetAttr{Atime: atime, Mtime: mtime}
	if !atime.IsZero() {
		in.Valid |= layer.SetAtime
	}
	if !mtime.IsZero() {
		in.Valid |= layer.SetMtime
	}
	before := reqs(a)
	var out layer.Attr
	must(t, f.Setattr(bg, nil, &in, &out), "utimes")
	if n := reqs(a) - before; n != 0 {
		t.Fatalf("the owner's utimes of a file with delayed writes sent %d requests, want none", n)
	}
	return out
}

// The owner's utimes of a file with delayed writes waits with them: no
// request, stat shows the times set, and the write-back sends them after
// the data (go build touches its up-to-date output, which it had just
// written: sending the utimes wrote the output back first). A write after
// it moves mtime as a write does; another user's utimes, which the server
// alone may allow, still goes to the server and is refused.
func TestOwnerTimesKept(t *testing.T) {
	x, a, f := delayedFile(t, "data")
	atime := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	mtime := time.Date(2002, 3, 4, 5, 6, 7, 8000, time.UTC)
	out := keptUtimes(t, a, f, atime, mtime)
	var at layer.Attr
	if !out.Atime.Equal(atime) || !out.Mtime.Equal(mtime) || out.Size != 4 {
		t.Fatalf("utimes answered atime %v mtime %v size %d, want %v %v 4", out.Atime, out.Mtime, out.Size, atime, mtime)
	}
	must(t, f.Getattr(bg, nil, &at), "stat")
	if !at.Atime.Equal(atime) || !at.Mtime.Equal(mtime) || !at.Ctime.After(mtime) {
		t.Fatalf("stat: atime %v mtime %v ctime %v, want %v %v and a ctime of now", at.Atime, at.Mtime, at.Ctime, atime, mtime)
	}
	if got := x.onServer(t, "f"); got != "" {
		t.Fatalf("the server has %q before any write-back", got)
	}
	if n := a.fs.Stats().Sprite.TimesKept; n != 1 {
		t.Fatalf("times_kept %d, want 1", n)
	}

	// Another user may not set them: the server says so.
	nobody := as(65534, 65534, 0o022)
	if e := f.Setattr(nobody, nil, &layer.SetAttr{Valid: layer.SetMtime, Mtime: time.Now()}, &out); e != syscall.EPERM {
		t.Fatalf("another user's utimes: %v, want EPERM", e)
	}

	h := open(t, f, unix.O_RDONLY)
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	st, err := os.Stat(filepath.Join(x.dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	var sys unix.Stat_t
	if err := unix.Stat(filepath.Join(x.dir, "f"), &sys); err != nil {
		t.Fatal(err)
	}
	if got := x.onServer(t, "f"); got != "data" || !st.ModTime().Equal(mtime) || !time.Unix(sys.Atim.Unix()).Equal(atime) {
		t.Fatalf("after the write-back the server has %q, mtime %v, atime %v; want %q %v %v", got, st.ModTime(), time.Unix(sys.Atim.Unix()), "data", mtime, atime)
	}

	// Kept, then a write: mtime is the write's.
	h = open(t, f, unix.O_WRONLY)
	write(t, h, 0, "D")
	must(t, f.Getattr(bg, nil, &at), "stat")
	keptUtimes(t, a, f, time.Time{}, mtime)
	write(t, h, 1, "ATA")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	if st, err := os.Stat(filepath.Join(x.dir, "f")); err != nil || !st.ModTime().After(mtime.Add(time.Hour)) {
		t.Fatalf("a write after a kept utimes: the server's mtime %v, want the write's", st.ModTime())
	}
}

// A file another client follows (it stat'd the file while this one held
// delayed writes of it) does not keep the owner's times: that client's
// stat shows them once the change's record reaches it (a setattr does not
// wait for other clients' journals: docs/network.md), not only after the
// write-back.
func TestFollowedTimesSent(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	fa, ha := create(t, a, "f")
	write(t, ha, 0, "hello")
	must(t, ha.Release(bg), "release")
	var at layer.Attr
	must(t, fa.Getattr(bg, nil, &at), "stat on a")
	fb := lookup(t, b, "f")
	must(t, fb.Getattr(bg, nil, &at), "stat on b") // follows
	mtime := time.Date(2002, 3, 4, 5, 6, 7, 8000, time.UTC)
	must(t, fa.Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetMtime, Mtime: mtime}, &at), "utimes")
	for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
		must(t, fb.Getattr(bg, nil, &at), "stat on b")
		if at.Mtime.Equal(mtime) && at.Size == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's stat after a's utimes: mtime %v size %d, want %v 5", at.Mtime, at.Size, mtime)
		}
	}
}

// A kept atime not after mtime moves at a read of the delayed data, as
// relatime moves the server's; not at a read through O_NOATIME.
func TestKeptAtimeMovesAtRead(t *testing.T) {
	x, a, f := delayedFile(t, "data")
	atime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	keptUtimes(t, a, f, atime, time.Date(2002, 3, 4, 5, 6, 7, 0, time.UTC))
	var at layer.Attr
	h := open(t, f, unix.O_RDONLY|unix.O_NOATIME)
	readAll(t, h)
	h.Release(bg)
	must(t, f.Getattr(bg, nil, &at), "stat")
	if !at.Atime.Equal(atime) {
		t.Fatalf("atime %v after an O_NOATIME read, want %v", at.Atime, atime)
	}
	before := time.Now()
	h = open(t, f, unix.O_RDONLY)
	readAll(t, h)
	h.Release(bg)
	must(t, f.Getattr(bg, nil, &at), "stat")
	if at.Atime.Before(before) {
		t.Fatalf("atime %v after a read, want it moved to the read's time (after %v)", at.Atime, before)
	}
	if x.onServer(t, "f") != "" {
		t.Fatal("the data was written back: the test tests nothing")
	}
}

// An open with O_TRUNC after kept times moves mtime as a truncation does
// (the times set do not come back over it at the write-back), and keeps
// the atime set.
func TestKeptTimesThenTrunc(t *testing.T) {
	x, a, f := delayedFile(t, "data")
	atime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	mtime := time.Date(2002, 3, 4, 5, 6, 7, 0, time.UTC)
	keptUtimes(t, a, f, atime, mtime)
	h := open(t, f, unix.O_WRONLY|unix.O_TRUNC)
	write(t, h, 0, "x")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	var sys unix.Stat_t
	if err := unix.Stat(filepath.Join(x.dir, "f"), &sys); err != nil {
		t.Fatal(err)
	}
	got, gotA := time.Unix(sys.Mtim.Unix()), time.Unix(sys.Atim.Unix())
	if x.onServer(t, "f") != "x" || !got.After(mtime.Add(time.Hour)) || !gotA.Equal(atime) {
		t.Fatalf("the server has %q, mtime %v, atime %v: want \"x\", a mtime of now, atime %v", x.onServer(t, "f"), got, gotA, atime)
	}
}
