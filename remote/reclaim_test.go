package remote

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
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
