package remote

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/writeback"
)

// After a reconnection the kernel forgets a directory and a file in it
// with delayed writes: the file's node stays (pinned), and so does the
// directory's, for its path. The kernel's next lookups make twins of
// both; a rename or unlink through the twin directory must move or
// remove the pinned node's name too, or its write-back walks a name
// that is gone or another file's, and keeps the data in a conflict
// copy. Each case: the write-back lands where the file is, or (the
// file replaced or removed by this client) its data is discarded; no
// conflict copy either way.
func TestTwinDirectoryNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change acts through the twin directory d2, the file's twin f2
		// looked up; it returns the name the data must be at ("": gone).
		change func(t *testing.T, d2, f2 layer.Node) string
	}{
		{"rename", func(t *testing.T, d2, f2 layer.Node) string {
			must(t, d2.Rename(bg, "f", d2, "g", 0), "rename f g")
			f2.Forget()
			d2.Forget() // the next reconnection's invalidation
			return "d/g"
		}},
		{"rename, then a new file at the old name", func(t *testing.T, d2, f2 layer.Node) string {
			must(t, d2.Rename(bg, "f", d2, "g", 0), "rename f g")
			_, h := create(t, d2, "f")
			write(t, h, 0, "new")
			must(t, h.Fsync(bg, false), "fsync the new f")
			h.Release(bg)
			f2.Forget()
			d2.Forget()
			return "d/g"
		}},
		// These two pass without the fix too: the file's link count
		// tells the write-back its data goes. They guard the names.
		{"rename over", func(t *testing.T, d2, f2 layer.Node) string {
			_, h := create(t, d2, "x")
			write(t, h, 0, "x's")
			must(t, h.Fsync(bg, false), "fsync x")
			h.Release(bg)
			must(t, d2.Rename(bg, "x", d2, "f", 0), "rename x f")
			return ""
		}},
		{"unlink", func(t *testing.T, d2, f2 layer.Node) string {
			must(t, d2.Unlink(bg, "f"), "unlink f")
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newSpriteServer(t, export.Options{})
			// The server's grace (as the fault harness has it) holds
			// the create of x: a request's timeout must outlast it.
			a := spriteClient(t, x, "a", Options{Timeout: 5 * testTimeout})
			var da layer.Attr
			d1, e := a.Mkdir(bg, "d", 0o755, &da)
			must(t, e, "mkdir d")
			f1, h := create(t, d1, "f")
			write(t, h, 0, "f's")
			h.Release(bg)
			// The server restarts: the fid kept for the write-back goes,
			// and the kernel forgets both nodes (the reconnection's
			// invalidation), then looks them up again.
			x.restart(t, 2*time.Second)
			f1.Forget()
			d1.Forget()
			var d2 layer.Node
			for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
				if d2, e = a.Lookup(bg, "d", &da); e != syscall.EIO || time.Now().After(deadline) {
					break // EIO: the cut connection, not yet found and redialled
				}
			}
			must(t, e, "lookup d")
			f2 := lookup(t, d2, "f")
			at := tc.change(t, d2, f2)
			a.fs.wb.WriteBackAll(bg, writeback.Age)
			copies, _ := filepath.Glob(filepath.Join(a.fs.wb.LostDir, "pipe", "d", "*"))
			if len(copies) != 0 || a.fs.wb.Ctr.Lost.Load() != 0 {
				t.Fatalf("conflict copies %v (%d bytes lost)", copies, a.fs.wb.Ctr.Lost.Load())
			}
			if at != "" {
				if got := x.onServer(t, at); got != "f's" {
					t.Fatalf("the server's %s holds %q, want f's", at, got)
				}
			} else if a.fs.wb.Ctr.Discarded.Load() != 3 {
				t.Fatalf("discarded %d bytes, want the 3 of the file this client replaced or removed", a.fs.wb.Ctr.Discarded.Load())
			}
			if s := a.fs.wb.DirtyBytes(); s != 0 {
				t.Fatalf("%d bytes still dirty", s)
			}
			// Nothing pinned any more: no directory stays kept for it
			// (the old node of d, the pinned one's name moved or gone).
			for deadline := time.Now().Add(slow); a.fs.keptNodes() > 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d directories kept with nothing pinned beneath", a.fs.keptNodes())
				}
			}
		})
	}
}

// keptNodes counts the nodes in the tree kept for a pinned node.
func (fs *FS) keptNodes() int {
	fs.tree.Lock()
	defer fs.tree.Unlock()
	k := 0
	for _, ns := range fs.named {
		for _, n := range ns {
			if n.kept {
				k++
			}
		}
	}
	return k
}
