package remote

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/writeback"
)

// A file with delayed writes here that another client linked keeps them
// when this client removes the name it knows, as a local file keeps its
// data under its other name: they are written back before the name
// goes, since no path this client knows reaches the file after. Before,
// the write-back found no name and took the data for a removed file's.
func TestUnlinkKeepsOtherLink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached bool // a's cache has the new link count; else it has none
		rename bool // a renames another file over the name; else unlinks it
	}{
		{"unlink/cached", true, false},
		{"unlink/asked", false, false},
		{"rename-over/cached", true, true},
		{"rename-over/asked", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newSpriteServer(t, export.Options{})
			a := spriteClient(t, x, "a", Options{})
			b := spriteClient(t, x, "b", Options{})
			fa, h := create(t, a, "f")
			write(t, h, 0, "from a")
			h.Release(bg)
			if got := x.onServer(t, "f"); got != "" {
				t.Fatalf("the server has %q before any write-back", got)
			}
			var la layer.Attr
			if _, e := b.Link(bg, lookup(t, b, "f"), "g", &la); e != 0 {
				t.Fatalf("b: link f g: %v", e)
			}
			path := fa.Token().Ino
			if tc.cached {
				// Once the journal tells a of the link, a's getattr shows it.
				deadline := time.Now().Add(20 * time.Second)
				for {
					var at layer.Attr
					must(t, fa.Getattr(bg, nil, &at), "getattr")
					if at.Nlink == 2 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("a still sees %d links after b's link", at.Nlink)
					}
					time.Sleep(10 * time.Millisecond)
				}
			} else {
				a.fs.cc.DropAttrs(path)
			}
			if tc.rename {
				_, ho := create(t, a, "other")
				ho.Release(bg)
				must(t, a.Rename(bg, "other", a, "f", 0), "rename other f")
			} else {
				must(t, a.Unlink(bg, "f"), "unlink f")
			}
			if got := x.onServer(t, "g"); got != "from a" {
				t.Fatalf("after a removed f the server's g has %q, want a's delayed write", got)
			}
			hb := open(t, lookup(t, b, "g"), unix.O_RDONLY)
			defer hb.Release(bg)
			if got := readAll(t, hb); got != "from a" {
				t.Fatalf("b read g: %q, want a's delayed write", got)
			}
			st := a.fs.Stats().Sprite
			if st.Discarded != 0 || st.Lost != 0 || st.WriteBacks["unlink"] != 1 {
				t.Fatalf("a's stats: %+v", st)
			}
		})
	}
}

// Writes through a handle after the name this client knew went, then a
// server restart: the handle's fid is gone and no name this client knows
// reaches the file, which keeps another. The data is kept in a conflict
// copy and the next fsync fails, never discarded as a removed file's.
func TestUnlinkedLinkAfterRestart(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	var logb syncBuf
	a := spriteClient(t, x, "a", Options{Logger: slog.New(slog.NewTextHandler(&logb, nil))})
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "first")
	var la layer.Attr
	if _, e := b.Link(bg, lookup(t, b, "f"), "g", &la); e != 0 {
		t.Fatalf("b: link f g: %v", e)
	}
	must(t, a.Unlink(bg, "f"), "unlink f")
	write(t, h, 5, " then more")
	x.restart(t, 0)
	if e := h.Fsync(bg, false); e != syscall.EIO {
		t.Fatalf("a's fsync after the restart: %v, want EIO", e)
	}
	h.Release(bg)
	if got := x.onServer(t, "g"); got != "first" {
		t.Fatalf("the server's g has %q, want what a wrote before the unlink", got)
	}
	copies, _ := filepath.Glob(filepath.Join(a.fs.wb.LostDir, "pipe", "*"))
	if len(copies) != 1 {
		t.Fatalf("conflict copies: %v, want one\n%s", copies, logb.String())
	}
	// The copy holds the bytes not written back, at their offsets (lost.go).
	if got, err := os.ReadFile(copies[0]); err != nil || string(got) != "\x00\x00\x00\x00\x00 then more" {
		t.Fatalf("the conflict copy holds %q (%v)", got, err)
	}
	if st := a.fs.Stats().Sprite; st.Discarded != 0 || st.Lost == 0 {
		t.Fatalf("a's stats: %+v", st)
	}
	if !strings.Contains(logb.String(), "hard link") {
		t.Fatalf("no log line names the cause:\n%s", logb.String())
	}
}

// A file whose own name went keeps a hard link's name in the client's
// tree, and the directory that name is in stays there too while the
// file has delayed writes, even when the kernel forgets the directory
// and the file (a reconnection makes it forget all it can): the
// write-back after a restart goes by that name. Before, the directory
// left the tree (only the pinned node's own directories were kept), the
// file had no path, and its bytes went to a conflict copy (a soak with
// --delegate, c1.8's f07).
func TestAliasPathAfterDirForgotten(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	var at layer.Attr
	f, h := create(t, d, "f06")
	write(t, h, 0, "first")
	b, e := d.Link(bg, f, "f07", &at)
	must(t, e, "link")
	b.Forget() // the kernel keeps one inode for both names: f06's
	_, hc := create(t, d, "f13")
	hc.Release(bg)
	must(t, d.Rename(bg, "f13", d, "f06", 0), "rename f13 f06")
	write(t, h, 5, " then more")
	h.Release(bg)
	f.Forget() // the kernel forgets the file and the directory
	d.Forget()
	x.restart(t, 0)
	if e := a.fs.wb.WriteBack(bg, f.Token(), writeback.Age); e != 0 {
		t.Fatalf("write-back after the restart: %v", e)
	}
	if got := x.onServer(t, "d/f07"); got != "first then more" {
		t.Fatalf("the server's d/f07 has %q", got)
	}
	if st := a.fs.Stats().Sprite; st.Lost != 0 || st.Discarded != 0 {
		t.Fatalf("a's stats: %+v", st)
	}
}
