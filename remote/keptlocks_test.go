package remote

import (
	"math"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/session"
)

// Locks kept under a delegation (keptlocks.go).

func flockOf(typ uint32) *layer.Lock {
	return &layer.Lock{Type: typ, End: math.MaxUint64, Flock: true}
}

func posixOf(typ uint32, start, end uint64) *layer.Lock {
	return &layer.Lock{Type: typ, Start: start, End: end}
}

// k0 is the connection h's locks would be kept on now.
func k0(h layer.Handle) (*session.Conn, layer.Errno) { return h.(*handle).fs.ss.Conn(bg) }

func lockReqs(n *node) uint64 {
	r := n.fs.Stats().Requests
	return r["lock"] + r["getlock"] + r["lopen"] + r["walk"]
}

// Under a delegation a client's shared locks, their unlocks and its
// lock tests are answered with no request, and conflict among its own
// owners as anywhere.
func TestKeptLocks(t *testing.T) {
	_, a, f := delegated(t, "data")
	before := lockReqs(a)
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	must(t, h.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "flock shared")
	must(t, h.Setlk(bg, 2, posixOf(syscall.F_RDLCK, 0, 9), false), "fcntl read lock")
	lk := posixOf(syscall.F_WRLCK, 5, 5)
	must(t, h.Getlk(bg, 3, lk), "F_GETLK")
	if lk.Type != syscall.F_RDLCK || lk.Start != 0 || lk.End != 9 {
		t.Fatalf("F_GETLK of another owner: %+v, want owner 2's read lock over 0-9", lk)
	}
	must(t, h.Setlk(bg, 1, flockOf(syscall.F_UNLCK), false), "flock unlock")
	must(t, h.Setlk(bg, 2, posixOf(syscall.F_UNLCK, 0, math.MaxUint64), false), "fcntl unlock")
	if n := lockReqs(a) - before; n != 0 {
		t.Fatalf("%d requests for a delegated open and 5 lock calls, want none", n)
	}
	if st := a.fs.Stats().Sprite; st.LocksKept != 5 || st.LocksPushed != 0 {
		t.Fatalf("locks kept %d, pushed %d; want 5 and 0", st.LocksKept, st.LocksPushed)
	}
}

// Another client's lock takes the delegation back first, and with it
// the locks kept under it: its exclusive lock is refused while they are
// held, and granted once they go.
func TestKeptLocksSeenByOther(t *testing.T) {
	x, a, f := delegated(t, "data")
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)
	must(t, ha.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "a's flock shared")
	must(t, ha.Setlk(bg, 2, posixOf(syscall.F_RDLCK, 10, 19), false), "a's read lock")

	b := spriteClient(t, x, "b", Options{})
	hb := open(t, lookup(t, b, "f"), unix.O_RDWR)
	defer hb.Release(bg)
	if e := hb.Setlk(bg, 7, flockOf(syscall.F_WRLCK), false); e != syscall.EAGAIN {
		t.Fatalf("b's exclusive flock while a holds a shared one: %v, want EAGAIN", e)
	}
	// (9P has no flock: a's is a read lock of the whole file there.)
	lk := posixOf(syscall.F_WRLCK, 15, 15)
	must(t, hb.Getlk(bg, 7, lk), "b's F_GETLK")
	if lk.Type != syscall.F_RDLCK || lk.Start > 15 || lk.End < 15 {
		t.Fatalf("b's F_GETLK: %+v, want one of a's read locks", lk)
	}
	if st := a.fs.Stats().Sprite; st.Returns != 1 || st.LocksPushed != 2 {
		t.Fatalf("a returned %d delegations and pushed %d locks, want 1 and 2", st.Returns, st.LocksPushed)
	}
	// a's locks are the server's now: their unlocks go there.
	must(t, ha.Setlk(bg, 1, flockOf(syscall.F_UNLCK), false), "a's flock unlock")
	if e := hb.Setlk(bg, 7, posixOf(syscall.F_WRLCK, 10, 10), false); e != syscall.EAGAIN {
		t.Fatalf("b's write lock over a's read lock: %v, want EAGAIN", e)
	}
	must(t, hb.Setlk(bg, 7, posixOf(syscall.F_WRLCK, 20, 20), false), "b's write lock beside it")
	ha.Flush(bg, 2) // a's owner 2 closes: its POSIX locks go
	must(t, hb.Setlk(bg, 7, flockOf(syscall.F_WRLCK), false), "b's exclusive flock once a's locks went")
}

// Another client's F_GETLK of an exclusive lock sees the shared locks
// kept here, though it holds a delegation of its own: the server takes
// this one back first.
func TestKeptLocksSeenByReader(t *testing.T) {
	x, a, f := delegated(t, "data")
	ha := open(t, f, unix.O_RDONLY)
	defer ha.Release(bg)
	must(t, ha.Setlk(bg, 2, posixOf(syscall.F_RDLCK, 10, 19), false), "a's read lock")
	b := spriteClient(t, x, "b", Options{})
	fb := lookup(t, b, "f")
	for range 2 { // the second open delegated
		hb := open(t, fb, unix.O_RDONLY)
		readAll(t, hb)
		hb.Release(bg)
	}
	hb := open(t, fb, unix.O_RDONLY)
	defer hb.Release(bg)
	must(t, hb.Setlk(bg, 7, posixOf(syscall.F_RDLCK, 15, 30), false), "b's read lock")
	lk := posixOf(syscall.F_RDLCK, 15, 15)
	must(t, hb.Getlk(bg, 8, lk), "b's F_GETLK of a read lock")
	if lk.Type != syscall.F_UNLCK {
		t.Fatalf("b's F_GETLK of a read lock: %+v, want none in the way", lk)
	}
	lk = posixOf(syscall.F_WRLCK, 12, 12)
	must(t, hb.Getlk(bg, 8, lk), "b's F_GETLK of a write lock")
	if lk.Type != syscall.F_RDLCK || lk.Start > 12 || lk.End < 12 {
		t.Fatalf("b's F_GETLK of a write lock: %+v, want a's read lock over 10-19", lk)
	}
	if st := a.fs.Stats().Sprite; st.LocksPushed != 1 {
		t.Fatalf("a pushed %d locks, want 1", st.LocksPushed)
	}
	if st := b.fs.Stats().Sprite; st.Delegations != 1 || st.LocksKept < 2 {
		t.Fatalf("b: %d delegations, %d lock calls kept; want 1 and at least 2", st.Delegations, st.LocksKept)
	}
}

// An exclusive lock of the client's own takes its kept locks to the
// server first, where they conflict with it.
func TestKeptLocksPushedForExclusive(t *testing.T) {
	_, a, f := delegated(t, "data")
	h := open(t, f, unix.O_RDWR) // delegated too: no other client has it open
	defer h.Release(bg)
	must(t, h.Setlk(bg, 1, posixOf(syscall.F_RDLCK, 0, 99), false), "owner 1's read lock")
	if st := a.fs.Stats().Sprite; st.LocksKept != 1 {
		t.Fatalf("locks kept: %d, want 1", st.LocksKept)
	}
	if e := h.Setlk(bg, 2, posixOf(syscall.F_WRLCK, 50, 50), false); e != syscall.EAGAIN {
		t.Fatalf("owner 2's write lock over owner 1's read lock: %v, want EAGAIN", e)
	}
	if st := a.fs.Stats().Sprite; st.LocksPushed != 1 {
		t.Fatalf("locks pushed: %d, want 1", st.LocksPushed)
	}
	must(t, h.Setlk(bg, 2, posixOf(syscall.F_WRLCK, 100, 100), false), "owner 2's write lock beside it")
	must(t, h.Setlk(bg, 1, posixOf(syscall.F_UNLCK, 0, math.MaxUint64), false), "owner 1's unlock")
	must(t, h.Setlk(bg, 2, posixOf(syscall.F_WRLCK, 50, 50), false), "owner 2's write lock once it went")
}

// A file another client's open has locked is not delegated, since the
// grantee would not see that lock (hostfs refuses an exclusive lock
// through an open for reading; a volume does not): here a shared one,
// and this client's shared lock goes to the server beside it.
func TestNoDelegationOfLockedFile(t *testing.T) {
	x := newSpriteServer(t, export.Options{Delegate: true})
	b := spriteClient(t, x, "b", Options{})
	_, hc := create(t, b, "f")
	write(t, hc, 0, "data")
	must(t, hc.Fsync(bg, false), "fsync")
	hc.Release(bg)
	// b's read lock goes to the server: b holds another there, taken
	// through an open for writing, which it then closes.
	fb := lookup(t, b, "f")
	hw := open(t, fb, unix.O_RDWR)
	must(t, hw.Setlk(bg, 7, posixOf(syscall.F_WRLCK, 100, 100), false), "b's write lock")
	hb := open(t, fb, unix.O_RDONLY)
	defer hb.Release(bg)
	must(t, hb.Setlk(bg, 8, posixOf(syscall.F_RDLCK, 0, 9), false), "b's read lock")
	hw.Release(bg)
	if st := b.fs.Stats().Sprite; st.LocksKept != 0 {
		t.Fatalf("b kept %d lock calls, want none", st.LocksKept)
	}

	a := spriteClient(t, x, "a", Options{})
	fa := lookup(t, a, "f")
	for range 2 { // the second open would be delegated by the first
		ha := open(t, fa, unix.O_RDONLY)
		if got := readAll(t, ha); got != "data" {
			t.Fatalf("a read %q", got)
		}
		must(t, ha.Setlk(bg, 1, posixOf(syscall.F_RDLCK, 0, 9), false), "a's read lock")
		ha.Release(bg)
	}
	if st := a.fs.Stats().Sprite; st.Delegations != 0 || st.LocksKept != 0 {
		t.Fatalf("a: %d delegations, %d locks kept; want none", st.Delegations, st.LocksKept)
	}
}

// Kept locks go with the connection, as the server's do: the next lock
// call of the handle that held them fails with EIO, then starts afresh.
func TestKeptLocksLostWithConnection(t *testing.T) {
	x, _, f := delegated(t, "data")
	h := open(t, f, unix.O_RDONLY)
	defer h.Release(bg)
	must(t, h.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "flock shared")
	k := &h.(*handle).fs.kept
	k.mu.Lock()
	old := k.files[h.(*handle).n.tok].c
	k.mu.Unlock()
	x.cut("a")
	deadline := time.Now().Add(time.Minute)
	for c, e := k0(h); e != 0 || c == old; c, e = k0(h) {
		if time.Now().After(deadline) {
			t.Fatal("no new connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := h.Setlk(bg, 1, flockOf(syscall.F_UNLCK), false); e != syscall.EIO {
		t.Fatalf("unlock after the connection went: %v, want EIO", e)
	}
	must(t, h.Setlk(bg, 1, flockOf(syscall.F_RDLCK), false), "flock shared again")
}
