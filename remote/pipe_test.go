package remote

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// An open of a file whose node has a fid sends the clone's Twalk and the
// Tlopen together (journal.OrdersFids): the Tlopen goes while the walk's
// reply is held, one round trip for two.
func TestOpenPipelined(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	h.Release(bg)
	var e layer.Errno
	sentWithWalk(t, x, a, "lopen", func() {
		var h layer.Handle
		if h, e = f.Open(bg, unix.O_WRONLY); e == 0 {
			h.Release(bg)
		}
	})
	if e != 0 {
		t.Fatalf("open: %v", e)
	}
}

// A listing is one round trip: the first Treaddir goes with the
// directory's walk and Tlopen, at the open (OpenDir), or, for a
// directory opened lazily, at its first read.
func TestListingPipelined(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	_, h := create(t, d, "x")
	h.Release(bg)
	readdirs := func() uint64 { return a.fs.Stats().Requests["readdir"] }
	before, piped := readdirs(), a.fs.Stats().Pipelined
	var got []string
	sentWithWalk(t, x, a, "readdir", func() { // no t here: the test's goroutine reports
		if ds, e := d.OpenDir(bg); e == 0 {
			for ent, ok, e := ds.Next(bg); ok && e == 0; ent, ok, e = ds.Next(bg) {
				if ent.Name != "." && ent.Name != ".." {
					got = append(got, ent.Name)
				}
			}
			ds.Close()
		}
	})
	if !slices.Equal(got, []string{"x"}) {
		t.Fatalf("listed %q, want [x]", got)
	}
	if n := readdirs() - before; n != 1 {
		t.Errorf("the listing sent %d Treaddirs, want 1", n)
	}
	if n := a.fs.Stats().Pipelined - piped; n != 2 {
		t.Errorf("pipelined %d requests, want 2 (the Tlopen and the Treaddir)", n)
	}
}

// A lock through a delegated open, which the server has not seen, goes
// with the file's walk and Tlopen: the Tlock is sent while the walk's
// reply is held. (A shared lock is kept under the delegation, unless the
// file holds locks on the server: here another owner's write lock.)
// Another client's lock of the file then waits for it.
func TestLockPipelined(t *testing.T) {
	x, a, f := delegated(t, "data")
	hw := open(t, f, unix.O_RDWR)
	defer hw.Release(bg)
	must(t, hw.Setlk(bg, 9, &layer.Lock{Type: unix.F_WRLCK, Start: 100, End: 100}, false), "owner 9's write lock")
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	if h.(*handle).everOpened() {
		t.Fatal("the open was sent to the server: the test tests nothing")
	}
	var e layer.Errno
	sentWithWalk(t, x, a, "lock", func() {
		e = h.Setlk(bg, 7, &layer.Lock{Type: unix.F_RDLCK, End: 9}, false)
	})
	if e != 0 {
		t.Fatalf("read lock: %v", e)
	}
	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "f"), unix.O_RDWR)
	defer hb.Release(bg)
	if e := hb.Setlk(bg, 8, &layer.Lock{Type: unix.F_WRLCK, End: 9}, false); e != unix.EAGAIN {
		t.Fatalf("b's write lock of bytes a holds locked: %v, want EAGAIN", e)
	}
}

// A create sends the clone of the directory's fid and the Tlcreate on
// it together: the Tlcreate goes while the walk's reply is held.
func TestCreatePipelined(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	var e layer.Errno
	sentWithWalk(t, x, a, "lcreate", func() {
		var at layer.Attr
		var h layer.Handle
		if _, h, e = d.Create(bg, "f", unix.O_WRONLY, 0o644, &at); e == 0 {
			h.Release(bg)
		}
	})
	if e != 0 {
		t.Fatalf("create: %v", e)
	}
	if got := names(t, d); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("listed %q, want [f]", got)
	}
}

// sentWithWalk runs op while x holds its Rwalk replies, and returns once
// op has: it fails t unless client c sent a request of type req (its
// stats' name) while a walk's reply was held, without waiting for it.
func sentWithWalk(t *testing.T, x *spriteServer, c *node, req string, op func()) {
	t.Helper()
	count := func() uint64 { return c.fs.Stats().Requests[req] }
	before := count()
	release := holdWalks(t, x)
	done := make(chan struct{})
	go func() {
		defer close(done)
		op()
	}()
	waitUntil(t, "the T"+req+" sent with its walk's reply held", func() bool { return count() > before })
	release()
	<-done
}

// holdWalks holds x's Rwalk replies until release (or the test's end):
// a request sent after a walk while it is held was sent without waiting
// for it.
func holdWalks(t *testing.T, x *spriteServer) (release func()) {
	x.held = make(chan struct{})
	x.hold.Store(p9wire.Twalk + 1)
	var once sync.Once
	release = func() {
		once.Do(func() {
			x.hold.Store(0)
			close(x.held)
		})
	}
	t.Cleanup(release)
	return release
}

// A lookup the cache cannot answer sends its Tgetattr with the walk:
// the Tgetattr goes while the walk's reply is held.
func TestLookupPipelined(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	if err := os.WriteFile(filepath.Join(x.dir, "f"), []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	getattrs := func() uint64 { return a.fs.Stats().Requests["getattr"] }
	before := getattrs()
	var at layer.Attr
	var e layer.Errno
	sentWithWalk(t, x, a, "getattr", func() { _, e = a.Lookup(bg, "f", &at) })
	if e != 0 || at.Size != 3 {
		t.Fatalf("lookup: size %d, %v; want 3", at.Size, e)
	}
	if n := getattrs() - before; n != 1 {
		t.Errorf("the lookup sent %d Tgetattrs, want 1", n)
	}
}
