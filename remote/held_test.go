package remote

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// Attributes of delayed data (issue 23; journal.Follow and Held): a stat
// on client B of a file client A holds delayed writes of shows A's size
// and mtime, whose data the server does not have: asked of A at B's first
// stat (Follow), and told by A before each close that wrote returns
// (Held), so B's stat right after A's close is current, with no wait.
func TestHeldAttrs(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	fa, ha := create(t, a, "f")
	write(t, ha, 0, "hello")
	must(t, ha.Flush(bg, 1), "close")
	must(t, ha.Release(bg), "release")
	attrs := func(n layer.Node) layer.Attr {
		t.Helper()
		var at layer.Attr
		must(t, n.Getattr(bg, nil, &at), "getattr")
		return at
	}
	same := func(when string, fb layer.Node, size uint64) {
		t.Helper()
		ga, gb := attrs(fa), attrs(fb)
		if ga.Size != size || gb.Size != size || !gb.Mtime.Equal(ga.Mtime) {
			t.Fatalf("%s: B's stat: size %d, mtime %v; A's: size %d, mtime %v; want size %d, A's mtime",
				when, gb.Size, gb.Mtime, ga.Size, ga.Mtime, size)
		}
	}
	// B's first stat: A is asked.
	fb := lookup(t, b, "f")
	same("B's first stat", fb, 5)

	// A writes again and closes: its close tells the server, and
	// returns once B's journal dropped B's attributes.
	ha = open(t, fa, unix.O_WRONLY)
	write(t, ha, 5, " world")
	must(t, ha.Flush(bg, 1), "close")
	same("after A's second close", fb, 11)
	// A truncation by A reaches the server at once, and the delayed
	// write after it is A's again.
	var out layer.Attr
	must(t, fa.Setattr(bg, ha, &layer.SetAttr{Valid: layer.SetSize, Size: 2}, &out), "truncate")
	write(t, ha, 2, "y!")
	must(t, ha.Flush(bg, 1), "close")
	same("after A's truncation and write", fb, 4)
	must(t, ha.Release(bg), "release")
	if got := x.onServer(t, "f"); len(got) > 2 {
		t.Fatalf("the server has %q: the delayed writes were written back, the test shows nothing", got)
	}
	if st := a.fs.Stats().Sprite; st.Helds < 2 {
		t.Fatalf("A sent %d Helds, want one at B's first stat and one a close since", st.Helds)
	}
	// Written back, the server's own attributes say the same.
	must(t, attrsFsync(fa), "fsync")
	same("after A's fsync", fb, 4)
}

// attrsFsync writes n's delayed data back.
func attrsFsync(n layer.Node) layer.Errno {
	h, e := n.Open(bg, unix.O_WRONLY)
	if e != 0 {
		return e
	}
	defer h.Release(bg)
	return h.Fsync(bg, false)
}
