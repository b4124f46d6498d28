package remote

import (
	"strings"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
)

// A file removed while open, written past DirtyMax, neither spins the
// writer (its delayed data cannot go back: it has no name) nor loses
// what it reads back.
func TestDirtyMaxUnlinkedOpenFile(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{DirtyMax: 1 << 20})
	_, h := create(t, a, "tmp")
	must(t, a.Unlink(bg, "tmp"), "unlink")
	chunk := strings.Repeat("x", 64<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 40 { // 2.5 MiB
			write(t, h, int64(i*len(chunk)), chunk)
		}
	}()
	select {
	case <-done:
	case <-time.After(slow):
		t.Fatal("writes to a removed open file past DirtyMax did not return")
	}
	buf := make([]byte, 10)
	if k, e := h.Read(bg, buf, 39*int64(len(chunk))); e != 0 || string(buf[:k]) != "xxxxxxxxxx" {
		t.Fatalf("read back %q, %v", buf[:k], e)
	}
	h.Release(bg)
	if s := a.fs.wb.DirtyBytes(); s != 0 {
		t.Fatalf("%d bytes still dirty after the last close of a removed file", s)
	}
	if d := a.fs.wb.Ctr.Discarded.Load(); d == 0 {
		t.Fatal("a removed file's delayed data was not counted as discarded")
	}
}
