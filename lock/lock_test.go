package lock

import (
	"context"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/layer"
)

var tok = layer.Token{Ino: 1, Gen: 1}

func lk(typ uint32, start, end uint64) *layer.Lock {
	return &layer.Lock{Type: typ, Start: start, End: end}
}

func TestConflictAndSplit(t *testing.T) {
	var tb Table
	ctx := context.Background()
	if e := tb.Set(ctx, tok, 1, lk(syscall.F_WRLCK, 0, 99), false); e != 0 {
		t.Fatal(e)
	}
	if e := tb.Set(ctx, tok, 2, lk(syscall.F_RDLCK, 50, 60), false); e != syscall.EAGAIN {
		t.Fatalf("overlapping lock of another owner: got %v, want EAGAIN", e)
	}
	// Owner 1 unlocks the middle: the lock splits in two.
	if e := tb.Set(ctx, tok, 1, lk(syscall.F_UNLCK, 40, 69), false); e != 0 {
		t.Fatal(e)
	}
	if e := tb.Set(ctx, tok, 2, lk(syscall.F_RDLCK, 50, 60), false); e != 0 {
		t.Fatalf("after unlock of the middle: %v", e)
	}
	q := lk(syscall.F_WRLCK, 70, 70)
	tb.Get(tok, 2, q)
	if q.Type != syscall.F_WRLCK || q.Start != 70 || q.End != 99 {
		t.Fatalf("Get reports %+v, want the right half 70-99", q)
	}
	// flock locks do not conflict with POSIX locks.
	fl := &layer.Lock{Type: syscall.F_WRLCK, End: math.MaxUint64, Flock: true}
	if e := tb.Set(ctx, tok, 3, fl, false); e != 0 {
		t.Fatalf("flock beside POSIX locks: %v", e)
	}
	tb.Release(tok, 1, false)
	tb.Release(tok, 2, false)
	tb.Release(tok, 3, true)
	if len(tb.files) != 0 {
		t.Fatalf("table not empty after releases: %v", tb.files)
	}
}

func TestWaitAndDeadlock(t *testing.T) {
	var tb Table
	ctx := context.Background()
	tb.Set(ctx, tok, 1, lk(syscall.F_WRLCK, 0, 9), false)
	tb.Set(ctx, tok, 2, lk(syscall.F_WRLCK, 10, 19), false)
	got := make(chan layer.Errno)
	go func() { got <- tb.Set(ctx, tok, 1, lk(syscall.F_WRLCK, 10, 19), true) }()
	// Wait until owner 1 is recorded as waiting for owner 2.
	for {
		tb.mu.Lock()
		_, w := tb.waiting[1]
		tb.mu.Unlock()
		if w {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if e := tb.Set(ctx, tok, 2, lk(syscall.F_WRLCK, 0, 9), true); e != syscall.EDEADLK {
		t.Fatalf("cycle: got %v, want EDEADLK", e)
	}
	tb.Release(tok, 2, false)
	if e := <-got; e != 0 {
		t.Fatalf("waiter after release: %v", e)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { got <- tb.Set(cctx, tok, 3, lk(syscall.F_RDLCK, 0, 0), true) }()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if e := <-got; e != syscall.EINTR {
		t.Fatalf("interrupted waiter: got %v, want EINTR", e)
	}
}

// Two holders of a shared flock upgrading at once: as in Linux, the old
// lock goes first, so one of them gets through.
func TestFlockUpgrades(t *testing.T) {
	var tb Table
	fl := func(typ uint32) *layer.Lock {
		return &layer.Lock{End: math.MaxUint64, Type: typ, Flock: true}
	}
	bg := context.Background()
	tb.Set(bg, tok, 1, fl(syscall.F_RDLCK), false)
	tb.Set(bg, tok, 2, fl(syscall.F_RDLCK), false)
	ctx, cancel := context.WithTimeout(bg, 2*time.Second)
	defer cancel()
	res := make(chan layer.Errno, 2)
	go func() { res <- tb.Set(ctx, tok, 1, fl(syscall.F_WRLCK), true) }()
	go func() { res <- tb.Set(ctx, tok, 2, fl(syscall.F_WRLCK), true) }()
	if a := <-res; a != 0 {
		t.Fatalf("first upgrade to finish: %v, want success", a)
	}
	cancel()
	<-res
}
