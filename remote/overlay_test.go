package remote

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/writeback"
)

// TestAttrsDuringWriteBack: attributes asked while a write-back of the
// file is under way (the server's, from before its data lands) show the
// delayed writes, or are asked again: never the server's old size alone.
// The soak: after a stall past the timeout a write-back went out on the
// new connection, a hard link's reply crossed it with the server's size
// 0, the kernel took that, and the next append landed at offset 0.
func TestAttrsDuringWriteBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		size func(a, f layer.Node) (uint64, layer.Errno)
	}{
		{"getattr", func(a, f layer.Node) (uint64, layer.Errno) {
			var out layer.Attr
			e := f.Getattr(bg, nil, &out)
			return out.Size, e
		}},
		{"link", func(a, f layer.Node) (uint64, layer.Errno) {
			var out layer.Attr
			_, e := a.Link(bg, f, "g", &out)
			return out.Size, e
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newSpriteServer(t, export.Options{})
			a := spriteClient(t, x, "a", Options{Timeout: 10 * time.Second})
			f, h := create(t, a, "f")
			write(t, h, 0, "abc")
			h.Release(bg)
			// With the write-back's own fid gone with its connection, it
			// opens one: its open's reply is held, the data not sent yet.
			x.cut("a")
			waitUntil(t, "a reconnection", func() bool { return a.Getattr(bg, nil, new(layer.Attr)) == 0 })
			x.held = make(chan struct{})
			x.hold.Store(p9wire.Tlopen + 1)
			wrote := make(chan layer.Errno, 1)
			go func() { wrote <- a.fs.wb.WriteBack(bg, f.Token(), writeback.Fsync) }()
			waitUntil(t, "the write-back's open is held", func() bool { return x.holding.Load() > 0 })
			type answer struct {
				size uint64
				e    layer.Errno
			}
			asked := make(chan answer, 1)
			go func() {
				size, e := tc.size(a, f)
				asked <- answer{size, e}
			}()
			// Released once the question waits on the write-back: its
			// server answer (size 0) is in by then.
			waitUntil(t, "the question waits for the write-back", func() bool {
				return stacksHave("writeback.(*Files).OverlayAttr")
			})
			x.hold.Store(0)
			close(x.held)
			if e := <-wrote; e != 0 {
				t.Fatalf("write-back: %v", e)
			}
			got := <-asked
			if got.e != 0 || got.size != 3 {
				t.Fatalf("%s during the write-back: size %d (%v), want 3", tc.name, got.size, got.e)
			}
		})
	}
}

// waitUntil polls cond until it holds, failing the test after a while.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(slow); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited in vain: %s", what)
		}
	}
}

// stacksHave tells whether a goroutine is in a function named fn.
func stacksHave(fn string) bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn)
}
