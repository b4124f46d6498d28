package remote

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/writeback"
)

// TestReclaimAfterGiveUp: a client cut off past its lease, while another
// client only reads the file, keeps its right to reclaim: after a server
// restart it reclaims and writes its delayed data back. (The server gave
// up waiting for it at the reader's open, and used to forget the right
// with it: the reclaim was refused as never held, and the data went to a
// conflict copy.)
func TestReclaimAfterGiveUp(t *testing.T) {
	x := newSpriteServer(t, export.Options{Lease: 50 * time.Millisecond})
	a := spriteClient(t, x, "a", Options{Timeout: 10 * time.Second})
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "a's")
	h.Release(bg)
	x.setDown("a", true)
	x.cut("a")
	hr := open(t, lookup(t, b, "f"), unix.O_RDONLY) // waits out a's lease, then reads without it
	hr.Release(bg)
	x.restart(t, 5*time.Second)
	x.setDown("a", false)
	hs := open(t, lookup(t, a, "f"), unix.O_RDONLY)
	if e := hs.Fsync(bg, false); e != 0 {
		t.Fatalf("a's fsync after the restart: %v (its reclaim refused?)", e)
	}
	hs.Release(bg)
	if got := x.onServer(t, "f"); got != "a's" {
		t.Fatalf("the server has %q, want a's delayed write", got)
	}
	if n := a.fs.wb.Ctr.Lost.Load(); n != 0 {
		t.Fatalf("a lost %d bytes", n)
	}
}

// TestWriteBackDuringOwnUnlink: a write-back that runs while this
// client's unlink of the file is landing (made on the server, its reply
// not yet in) finds no name of the file; it leaves the data for the
// unlink to discard, not keep it in a conflict copy as another client's
// doing (the soak: a write-back by age after a reconnection, beside the
// program's own unlink).
func TestWriteBackDuringOwnUnlink(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{Timeout: 10 * time.Second})
	f, h := create(t, a, "f")
	write(t, h, 0, "abc")
	h.Release(bg)
	x.cut("a") // the fid opened for the write-back goes with its connection
	waitUntil(t, "a reconnection", func() bool { return a.Getattr(bg, nil, new(layer.Attr)) == 0 })
	x.held = make(chan struct{})
	x.hold.Store(p9wire.Tunlinkat + 1)
	unlinked := make(chan layer.Errno, 1)
	go func() { unlinked <- a.Unlink(bg, "f") }()
	for deadline := time.Now().Add(slow); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(x.dir, "f")); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never unlinked f")
		}
	}
	a.fs.wb.WriteBack(bg, f.Token(), writeback.Fsync)
	x.hold.Store(0)
	close(x.held)
	if e := <-unlinked; e != 0 {
		t.Fatalf("unlink: %v", e)
	}
	if n := a.fs.wb.Ctr.Lost.Load(); n != 0 {
		t.Fatalf("%d bytes kept in a conflict copy for an unlink of this client's own", n)
	}
	a.fs.wb.WriteBack(bg, f.Token(), writeback.Age) // the next, unlink landed: the data goes
	if n := a.fs.wb.Ctr.Discarded.Load(); n != 3 {
		t.Fatalf("discarded %d bytes, want the 3 delayed (lost %d)", n, a.fs.wb.Ctr.Lost.Load())
	}
}
