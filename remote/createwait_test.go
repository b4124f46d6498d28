package remote

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
)

// A create that recalled another client's delayed writes returns without
// waiting for its own client's journal: the client's kernel holds the
// directory's lock across a create, and the journal, dropping an entry
// of that directory, waits for the lock. They waited for each other until
// the recall timeout, and meanwhile the client answered no recall: the
// server gave up on it, and others read its files without its writes.
func TestCreateDoesNotWaitForItsJournal(t *testing.T) {
	x := newSpriteServer(t, export.Options{RecallTimeout: time.Hour})
	var (
		mu      sync.Mutex
		armed   bool
		blocked = make(chan struct{})
		release = make(chan struct{})
	)
	a := spriteClient(t, x, "a", Options{onRecord: func(*journal.Record, []layer.Event) {
		mu.Lock()
		hold := armed
		armed = false
		mu.Unlock()
		if hold {
			close(blocked)
			<-release // a's journal stands still, as behind the kernel's lock
		}
	}})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	b := spriteClient(t, x, "b", Options{})

	// a caches z; b holds delayed writes of x.
	_, hz := create(t, b, "z")
	write(t, hz, 0, "zzz")
	must(t, hz.Fsync(bg, false), "fsync")
	hz.Release(bg)
	ha := open(t, lookup(t, a, "z"), unix.O_RDONLY)
	readAll(t, ha)
	ha.Release(bg)
	_, hx := create(t, b, "x")
	write(t, hx, 0, "delayed")
	hx.Release(bg)

	// A change of z stops a's journal at its record.
	mu.Lock()
	armed = true
	mu.Unlock()
	var out layer.Attr
	must(t, lookup(t, b, "z").Setattr(bg, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 1}, &out), "truncate z")
	select {
	case <-blocked:
	case <-time.After(slow):
		t.Fatal("a's journal never got z's record")
	}

	done := make(chan layer.Errno, 1)
	go func() {
		var at layer.Attr
		_, h, e := a.Create(bg, "x", unix.O_WRONLY|unix.O_CREAT, 0o644, &at)
		if e == 0 {
			h.Release(bg)
		}
		done <- e
	}()
	select {
	case e := <-done:
		must(t, e, "a's create of x")
	case <-time.After(slow):
		unblock()
		t.Fatalf("a's create of x, which recalled b's writes, waited %v for a's own journal", slow)
	}
	unblock()
	h := open(t, lookup(t, a, "x"), unix.O_RDONLY)
	defer h.Release(bg)
	if got := readAll(t, h); got != "delayed" {
		t.Fatalf("a read %q, want b's recalled %q", got, "delayed")
	}
}
