package remote

import (
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// TestTruncOpenLostReply: an open with O_TRUNC that the server makes but
// whose reply the connection loses is sent again, not failed: failed,
// the client kept its delayed writes of the file, and wrote them back
// onto the file the server had truncated, at their offsets past its end
// (a hole of zeros where the file's bytes were).
func TestTruncOpenLostReply(t *testing.T) {
	x, f, h := syncedFile(t)
	write(t, h, 10, "abc") // delayed
	h.Release(bg)

	x.lose.Store(p9wire.Tlopen + 1)
	ht, e := f.Open(bg, unix.O_WRONLY|unix.O_TRUNC)
	if x.lose.Load() != 0 {
		t.Fatal("the open's reply was never lost: the test tests nothing")
	}
	if e == 0 {
		write(t, ht, 0, "x")
		must(t, ht.Fsync(bg, false), "fsync")
		ht.Release(bg)
	} else {
		t.Errorf("the open whose reply was lost failed: %v, want it sent again", e)
	}
	hs := open(t, f, unix.O_RDONLY)
	must(t, hs.Fsync(bg, false), "fsync") // what is delayed goes back
	hs.Release(bg)
	got := x.onServer(t, "f")
	if strings.Contains(got, "\x00") || (got != "x" && got != "0123456789abc" && got != "") {
		t.Fatalf("the server has %q, want %q (or, had the open failed, what it had before it or nothing)", got, "x")
	}
}

// TestTruncSetattrLostReply: a truncation the server makes but whose
// reply the connection loses is sent again, not failed: failed, the
// client kept the file's old size, and an append landed past the end the
// server had cut (zeros before it).
func TestTruncSetattrLostReply(t *testing.T) {
	x, f, h := syncedFile(t)
	x.lose.Store(p9wire.Tsetattr + 1)
	var out layer.Attr
	e := f.Setattr(bg, h, &layer.SetAttr{Valid: layer.SetSize, Size: 0}, &out)
	if x.lose.Load() != 0 {
		t.Fatal("the setattr's reply was never lost: the test tests nothing")
	}
	if e != 0 {
		t.Fatalf("the truncation whose reply was lost failed: %v, want it sent again", e)
	}
	if out.Size != 0 {
		t.Fatalf("size after the truncation: %d, want 0", out.Size)
	}
	h.Release(bg)
}

// syncedFile is a client's file f, written and fsynced, open as h.
func syncedFile(t *testing.T) (*spriteServer, layer.Node, layer.Handle) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, "0123456789")
	must(t, h.Fsync(bg, false), "fsync")
	return x, f, h
}

// TestTruncOpenFailed: an open with O_TRUNC that the server made but
// whose reply never came, the server out of reach past the timeout, fails
// with EIO; the file may have been truncated, so nothing of it stays
// cached, and its names are looked up again (the kernel's size with them):
// before, an append put at the old size left zeros where the file's
// bytes had been (a soak with --delegate, c3.8's f14).
func TestTruncOpenFailed(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{Timeout: 300 * time.Millisecond})
	f, h := create(t, a, "f")
	write(t, h, 0, "0123456789")
	must(t, h.Fsync(bg, false), "fsync")
	h.Release(bg)
	var at layer.Attr
	must(t, f.Getattr(bg, nil, &at), "getattr")
	var mu sync.Mutex
	var evs []layer.Event
	a.fs.st.Events().Subscribe(func(ev layer.Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})
	x.lose.Store(p9wire.Tlopen + 1)
	x.setDown("a", true)
	if _, e := f.Open(bg, unix.O_WRONLY|unix.O_TRUNC); e != syscall.EIO {
		t.Fatalf("the open with the server out of reach: %v, want EIO", e)
	}
	if got := x.onServer(t, "f"); got != "" {
		t.Fatalf("the server has %q: its open did not truncate, the test tests nothing", got)
	}
	mu.Lock()
	named := slices.ContainsFunc(evs, func(ev layer.Event) bool { return ev.Kind == layer.Entries && ev.Name == "f" })
	mu.Unlock()
	if !named {
		t.Fatalf("the failed open told the views nothing of the file's name: %+v", evs)
	}
	x.setDown("a", false)
	deadline := time.Now().Add(slow)
	for {
		e := f.Getattr(bg, nil, &at)
		if e == 0 && at.Size == 0 {
			break
		}
		if e == 0 || time.Now().After(deadline) {
			t.Fatalf("after the failed open the file's size is %d (%v), want 0, the server's", at.Size, e)
		}
	}
}
