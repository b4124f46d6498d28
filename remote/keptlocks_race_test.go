package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// twoOfOneFile is clients a and b of a new server, and their nodes of
// file f, which a made with "data".
func twoOfOneFile(t *testing.T, opts export.Options) (x *spriteServer, a, b *node, fa, fb layer.Node) {
	t.Helper()
	x = newSpriteServer(t, opts)
	a = spriteClient(t, x, "a", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "data")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	b = spriteClient(t, x, "b", Options{})
	return x, a, b, lookup(t, a, "f"), lookup(t, b, "f")
}

// A create (O_CREAT, no O_EXCL) of a file that is there opens it for
// writing, which may end the delegation on the server: the kept locks go
// there first.
func TestKeptLocksPushedAtCreate(t *testing.T) {
	x, a, f := delegated(t, "data")
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)
	must(t, ha.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "a's flock shared")
	if st := a.fs.Stats().Sprite; st.LocksKept != 1 {
		t.Fatalf("kept %d", st.LocksKept)
	}
	b := spriteClient(t, x, "b", Options{})
	fb := lookup(t, b, "f")
	hr := open(t, fb, unix.O_RDONLY)
	defer hr.Release(bg)
	readAll(t, hr)
	var at layer.Attr
	_, hc, e := a.Create(bg, "f", unix.O_RDWR, 0o644, &at)
	must(t, e, "a's create of existing f")
	defer hc.Release(bg)
	hb := open(t, fb, unix.O_RDWR)
	defer hb.Release(bg)
	if e := hb.Setlk(bg, 7, flockOf(syscall.F_WRLCK), false); e != syscall.EAGAIN {
		t.Fatalf("b's exclusive flock while a keeps a shared one: %v, want EAGAIN (a pushed %d)", e, a.fs.Stats().Sprite.LocksPushed)
	}
}

// Two clients keeping shared locks open the file for writing at once:
// each pushes its locks, and neither push waits for the other's (read
// locks take no delegation back).
func TestKeptLocksTwoPushersAtOnce(t *testing.T) {
	x, a, b, fa, fb := twoOfOneFile(t, export.Options{Delegate: true, RecallTimeout: 3 * time.Second})
	var hs []layer.Handle
	fs := []layer.Node{fa, fb}
	for _, f := range fs {
		for range 2 {
			h := open(t, f, unix.O_RDONLY)
			readAll(t, h)
			hs = append(hs, h)
		}
	}
	must(t, hs[1].Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "a keeps")
	must(t, hs[3].Setlk(bg, 2, flockOf(syscall.F_RDLCK), false), "b keeps")
	if a.fs.Stats().Sprite.LocksKept != 1 || b.fs.Stats().Sprite.LocksKept != 1 {
		t.Fatalf("kept: a %d, b %d; want 1 each", a.fs.Stats().Sprite.LocksKept, b.fs.Stats().Sprite.LocksKept)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, e := f.Open(bg, unix.O_RDWR)
			if e == 0 {
				h.Release(bg)
			}
		}()
	}
	wg.Wait()
	if n, _ := export.ParseStats(x.s.Stats()); n["sprite.recall.timeouts"] != 0 {
		t.Fatalf("two opens for writing took %v: %d returns given up on (the pushes waited for each other)", time.Since(start), n["sprite.recall.timeouts"])
	}
}

// While a's Return is out (its reopen held), a's F_GETLK of a write lock
// still takes b's delegation back: b's kept read lock is seen.
func TestKeptLocksGetlkWhileReturning(t *testing.T) {
	x, a, b, fa, fb := twoOfOneFile(t, export.Options{Delegate: true})
	ha1 := open(t, fa, unix.O_RDONLY) // on the server, grants
	readAll(t, ha1)
	ha2 := open(t, fa, unix.O_RDONLY) // delegated: not on the server
	hb1 := open(t, fb, unix.O_RDONLY)
	readAll(t, hb1)
	_ = ha2
	if !a.fs.wb.Delegated(fa.(*node).tok) || !b.fs.wb.Delegated(fb.(*node).tok) {
		t.Fatalf("not both delegated")
	}
	must(t, hb1.Setlk(bg, 2, posixOf(syscall.F_RDLCK, 0, 9), false), "b keeps a read lock")
	if b.fs.Stats().Sprite.LocksKept != 1 {
		t.Fatal("b did not keep")
	}
	release := holdWalks(t, x) // a's Return: its reopen of ha2 waits
	// b's F_GETLK of a write lock (no conflict among its own) goes to
	// the server, which takes a's delegation back.
	go func() {
		lk := posixOf(syscall.F_WRLCK, 0, 0)
		hb1.Getlk(bg, 2, lk)
	}()
	waitUntil(t, "a's Return applied", func() bool { return !a.fs.wb.Delegated(fa.(*node).tok) })
	lk := posixOf(syscall.F_WRLCK, 5, 5)
	e := ha1.Getlk(bg, 9, lk)
	release()
	must(t, e, "a's F_GETLK")
	if lk.Type == syscall.F_UNLCK {
		t.Fatalf("a's F_GETLK of a write lock over b's kept read lock: none in the way (b delegated: %v)", b.fs.wb.Delegated(fb.(*node).tok))
	}
}

// A Return that crosses the answer of the open that granted the
// delegation: the client answers it, and takes no delegation from the
// answer (it would keep locks the server does not know it may).
func TestReturnCrossingGrant(t *testing.T) {
	x, _, _, fa, fb := twoOfOneFile(t, export.Options{Delegate: true})
	ha := open(t, fa, unix.O_RDONLY) // a's read open, on the server
	readAll(t, ha)
	// a's delegation goes: a write open of b's, closed.
	hw := open(t, fb, unix.O_RDWR)
	hw.Release(bg)
	// b's read open: granted, its answer held.
	x.held = make(chan struct{})
	x.hold.Store(12 + 1) // Rlopen
	var hb layer.Handle
	done := make(chan struct{})
	go func() {
		defer close(done)
		var e layer.Errno
		hb, e = fb.Open(bg, unix.O_RDONLY)
		must(t, e, "b's open")
	}()
	waitUntil(t, "b's Rlopen held", func() bool { return x.holding.Load() > 0 })
	// a's F_GETLK takes b's delegation back; b answers at once.
	lk := posixOf(syscall.F_WRLCK, 0, 0)
	must(t, ha.Getlk(bg, 1, lk), "a's F_GETLK")
	x.hold.Store(0)
	close(x.held)
	<-done
	defer hb.Release(bg)
	must(t, hb.Setlk(bg, 2, flockOf(syscall.F_RDLCK), false), "b's shared flock")
	hw = open(t, fa, unix.O_RDWR)
	defer hw.Release(bg)
	if e := hw.Setlk(bg, 3, flockOf(syscall.F_WRLCK), false); e != syscall.EAGAIN {
		t.Fatalf("a's exclusive flock while b holds a shared one: %v, want EAGAIN", e)
	}
}

// A refresh's listing starts no lookups ahead, and leaves the node's
// (ahead.go) to the real stream in progress.
func TestRefreshLeavesListingAhead(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	os.Mkdir(filepath.Join(x.dir, "d"), 0o755)
	for i := range 40000 {
		os.WriteFile(filepath.Join(x.dir, "d", fmt.Sprintf("a-rather-long-name-for-a-file-%05d", i)), nil, 0o644)
	}
	a := spriteClient(t, x, "a", Options{})
	d := lookup(t, a, "d")
	dn := d.(*node)
	names(t, d)
	if _, ok := a.fs.cc.Listing(dn.tok.Ino, uint32(os.Getuid())); !ok {
		t.Fatal("not cached")
	}
	_, h := create(t, d, "y")
	h.Release(bg)
	s, e := d.OpenDir(bg)
	must(t, e, "opendir")
	defer s.Close()
	_, _, e = s.Next(bg)
	must(t, e, "next")
	real := dn.listing.Load()
	if real == nil {
		t.Fatal("no listing stored by the real stream")
	}
	waitUntil(t, "the refresh's listing", func() bool {
		r := &a.fs.refresh
		r.mu.Lock()
		defer r.mu.Unlock()
		return a.fs.Stats().ListsRefreshed == 1 && len(r.dirs) == 0
	})
	if got := dn.listing.Load(); got != real {
		t.Fatalf("node's listing after the refresh: %p, the real stream's %p", got, real)
	}
}

// Kept locks of a client cut off, whose delegation the server gave up
// on, are lost with the connection, not pushed on the new one: another
// client took and let go an exclusive lock meanwhile.
func TestKeptLocksNotMovedToNewConnection(t *testing.T) {
	x := newSpriteServer(t, export.Options{Delegate: true, Lease: 200 * time.Millisecond})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, "data")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	open(t, f, unix.O_RDONLY).Release(bg)
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)
	must(t, ha.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "a's shared flock")
	if a.fs.Stats().Sprite.LocksKept != 1 {
		t.Fatal("not kept")
	}
	x.setDown("a", true)
	x.cut("a")
	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "f"), unix.O_RDWR)
	must(t, hb.Setlk(bg, 7, flockOf(syscall.F_WRLCK), false), "b's exclusive flock while a is away")
	must(t, hb.Setlk(bg, 7, flockOf(syscall.F_UNLCK), false), "b's unlock")
	hb.Release(bg)
	x.setDown("a", false)
	waitUntil(t, "a's kept lock lost", func() bool {
		a.fs.kept.mu.Lock()
		defer a.fs.kept.mu.Unlock()
		return len(a.fs.kept.files) == 0
	})
	e := ha.Setlk(bg, 1, flockOf(syscall.F_UNLCK), false)
	if e != syscall.EIO {
		t.Fatalf("a's unlock after its lock was broken by b's exclusive one: %v, want EIO", e)
	}
}
