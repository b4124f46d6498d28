package remote

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
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

// A create under a umask asks whether the directory has a default ACL
// (which would take the umask's place) once; later creates there find
// the answer in the cache. A default ACL set since is asked for again.
func TestDefaultACLAskedOnce(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	ctx := as(0, 0, 0o022)
	walks := func() uint64 { return a.fs.Stats().Requests["xattrwalk"] }
	before := walks()
	for _, name := range []string{"f", "g", "h"} {
		var at layer.Attr
		_, h, e := d.Create(ctx, name, unix.O_WRONLY, 0o666, &at)
		must(t, e, "create %s", name)
		h.Release(bg)
		if at.Mode&0o777 != 0o644 {
			t.Errorf("%s: mode %o, want 644", name, at.Mode&0o777)
		}
	}
	if n := walks() - before; n != 1 {
		t.Errorf("3 creates asked for the default ACL %d times, want 1", n)
	}
	// A default ACL of rwx for all: the next create's mode is 666, the
	// umask set aside.
	acl := []byte{2, 0, 0, 0}
	for _, tag := range []uint16{0x01, 0x04, 0x20} { // ACL_USER_OBJ, ACL_GROUP_OBJ, ACL_OTHER
		acl = append(acl, byte(tag), byte(tag>>8), 7, 0, 0xff, 0xff, 0xff, 0xff)
	}
	must(t, d.(*node).Setxattr(ctx, "system.posix_acl_default", acl, 0), "set the default ACL")
	var at layer.Attr
	_, h, e := d.Create(ctx, "i", unix.O_WRONLY, 0o666, &at)
	must(t, e, "create i")
	h.Release(bg)
	if at.Mode&0o777 != 0o666 {
		t.Errorf("a create under a default ACL: mode %o, want 666", at.Mode&0o777)
	}
}
