package compress

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

var ctx = context.Background()

// open stacks a fresh compress layer over dir (a new layer forgets every
// state, as a remount does) and returns its root.
func open(t *testing.T, dir string) layer.Node {
	t.Helper()
	lower, err := hostfs.New(stack.New(stack.Options{}), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lower.Forget)
	return New(lower)
}

// openFile opens (creating) name in root for reading and writing.
func openFile(t *testing.T, root layer.Node, name string) (layer.Node, layer.Handle) {
	t.Helper()
	var a layer.Attr
	n, h, e := root.Create(ctx, name, syscall.O_RDWR|syscall.O_CREAT, 0o644, &a)
	if e != 0 {
		t.Fatalf("create %s: %v", name, e)
	}
	return n, h
}

func readAll(t *testing.T, h layer.Handle, size int) ([]byte, layer.Errno) {
	t.Helper()
	buf := make([]byte, size+1)
	k, e := h.Read(ctx, buf, 0)
	return buf[:k], e
}

func size(t *testing.T, n layer.Node, h layer.Handle) uint64 {
	t.Helper()
	var a layer.Attr
	if e := n.Getattr(ctx, h, &a); e != 0 {
		t.Fatalf("getattr: %v", e)
	}
	return a.Size
}

// content draws n bytes: text-like (compressible), random
// (incompressible), or zeros.
func content(r *rand.Rand, n int) []byte {
	p := make([]byte, n)
	switch r.IntN(3) {
	case 0:
		words := []string{"func ", "return ", "err ", "nil", "\n\t", "if ", "{", "}", "x := ", "layer."}
		for i := 0; i < n; {
			i += copy(p[i:], words[r.IntN(len(words))])
		}
	case 1:
		for i := range p {
			p[i] = byte(r.Uint32())
		}
	}
	return p
}

// A random sequence of writes, truncates, hole punches and reads, across
// block boundaries, agrees with a byte slice; so does the file read
// through a fresh layer (from the lower file alone) after each step.
func TestProperty(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	root := open(t, dir)
	n, h := openFile(t, root, "f")
	defer n.Forget()
	defer h.Release(ctx)
	var model []byte
	for step := range 300 {
		var what string
		// Offsets cluster around block boundaries, where the bugs are.
		off := int(r.IntN(6))*blockSize + r.IntN(200) - 100
		off = max(off, 0)
		switch r.IntN(10) {
		case 0, 1, 2, 3, 4:
			p := content(r, 1+r.IntN(2*blockSize+100))
			what = "write"
			if k, e := h.Write(ctx, p, int64(off)); e != 0 || k != len(p) {
				t.Fatalf("step %d: write %d at %d: %d, %v", step, len(p), off, k, e)
			}
			if off+len(p) > len(model) {
				model = append(model, make([]byte, off+len(p)-len(model))...)
			}
			copy(model[off:], p)
		case 5, 6:
			what = "truncate"
			var a layer.Attr
			if e := n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(off)}, &a); e != 0 {
				t.Fatalf("step %d: truncate to %d: %v", step, off, e)
			}
			if off > len(model) {
				model = append(model, make([]byte, off-len(model))...)
			}
			model = model[:off]
		case 7:
			what = "punch"
			k := r.IntN(2 * blockSize)
			if e := h.Allocate(ctx, int64(off), int64(k+1), punchHole|keepSize); e != 0 {
				t.Fatalf("step %d: punch: %v", step, e)
			}
			if off < len(model) {
				clear(model[off:min(len(model), off+k+1)])
			}
		default:
			what = "read"
			k := r.IntN(3 * blockSize)
			buf := make([]byte, k)
			got, e := h.Read(ctx, buf, int64(off))
			var want []byte
			if off < len(model) {
				want = model[off:min(len(model), off+k)]
			}
			if e != 0 || !bytes.Equal(buf[:got], want) {
				t.Fatalf("step %d: read %d at %d: %d bytes (%v), want %d of the model", step, k, off, got, e, len(want))
			}
		}
		if s := size(t, n, h); s != uint64(len(model)) {
			t.Fatalf("step %d (%s): size %d, want %d", step, what, s, len(model))
		}
		if step%10 == 0 {
			checkFresh(t, dir, "f", model)
		}
	}
	checkFresh(t, dir, "f", model)
}

// checkFresh reads name through a new layer over dir.
func checkFresh(t *testing.T, dir, name string, want []byte) {
	t.Helper()
	d, done, e := walk(ctx, open(t, dir), name)
	if e != 0 {
		t.Fatalf("walk to %s: %v", name, e)
	}
	defer done()
	var a layer.Attr
	n, e := d.Lookup(ctx, filepath.Base(name), &a)
	if e != 0 {
		t.Fatalf("lookup %s: %v", name, e)
	}
	defer n.Forget()
	if a.Size != uint64(len(want)) {
		t.Fatalf("a fresh layer sees size %d, want %d", a.Size, len(want))
	}
	h, e := n.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		t.Fatal(e)
	}
	defer h.Release(ctx)
	got, e := readAll(t, h, len(want))
	if e != 0 || !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("a fresh layer reads %d bytes (%v), unlike the model's %d from byte %d", len(got), e, len(want), i)
	}
}

// Incompressible data is stored raw: written in one go, the lower file is
// the data, the header and the table, no more; written in pieces, blocks
// rewritten as they fill may leave up to two blocks of free room (a full
// block does not fit where its shorter version was) and a table's old
// place. Compressible data
// takes far less; zeros take nothing but the header and table.
func TestStoredSize(t *testing.T) {
	dir := t.TempDir()
	root := open(t, dir)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 10*blockSize + 123
	random := make([]byte, n)
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	text := bytes.Repeat([]byte("the compress layer stores this line once "), n/41+1)[:n]
	for name, c := range map[string]struct {
		data []byte
		max  int
	}{
		"random": {random, n + headerSize + 16*entrySize + 2*blockSize + 4096},
		"text":   {text, n / 20},
		"zeros":  {make([]byte, n), headerSize + 11*entrySize},
	} {
		nd, h := openFile(t, root, name)
		// In pieces, as a program writes, so that blocks are rewritten.
		for off := 0; off < n; off += 5000 {
			h.Write(ctx, c.data[off:min(n, off+5000)], int64(off))
		}
		h.Release(ctx)
		nd.Forget()
		if got := lowerSize(t, dir, name); got > int64(c.max) {
			t.Errorf("%s: %d bytes written in pieces stored as %d, want at most %d", name, n, got, c.max)
		}
		checkFresh(t, dir, name, c.data)
	}
	nd, h := openFile(t, root, "whole")
	h.Write(ctx, random, 0)
	h.Release(ctx)
	nd.Forget()
	if got, want := lowerSize(t, dir, "whole"), int64(n+headerSize+11*entrySize); got != want {
		t.Errorf("%d random bytes written at once stored as %d, want %d", n, got, want)
	}
}

func lowerSize(t *testing.T, dir, name string) int64 {
	fi, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A flipped byte anywhere in a stored block, its table entry or the
// header makes reads fail with EIO, never give other bytes.
func TestTamper(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("tamper-evident "), 3*blockSize/15)
	root := open(t, dir)
	n, h := openFile(t, root, "f")
	h.Write(ctx, data, 0)
	h.Release(ctx)
	n.Forget()
	path := filepath.Join(dir, "f")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hdr, _ := decodeHeader(orig)
	en, _ := decodeEntry(orig[hdr.tableOff+entrySize:]) // block 1
	for _, c := range []struct {
		what string
		at   uint64
	}{
		{"stored block", en.off + uint64(en.n)/2},
		{"first byte of a block", en.off},
		{"table entry", hdr.tableOff + entrySize + 3},
		{"header size", 20},
	} {
		b := bytes.Clone(orig)
		b[c.at] ^= 0x40
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		root := open(t, dir)
		var a layer.Attr
		n, e := root.Lookup(ctx, "f", &a)
		if e != 0 {
			t.Fatalf("%s: lookup: %v", c.what, e)
		}
		h, e := n.Open(ctx, syscall.O_RDONLY)
		if e != 0 {
			t.Fatalf("%s: open: %v", c.what, e)
		}
		buf := make([]byte, len(data))
		k, e := h.Read(ctx, buf, 0)
		if e != syscall.EIO {
			t.Errorf("%s flipped: read gives %d bytes (equal: %v) and %v, want EIO", c.what, k, bytes.Equal(buf[:k], data[:k]), e)
		}
		h.Release(ctx)
		n.Forget()
	}
}

// A lower file without the magic is a plain file, served as it is; one
// emptied through the layer becomes the layer's on its next write.
func TestPlainFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "plain"), []byte("written beside shale"), 0o644)
	root := open(t, dir)
	var a layer.Attr
	n, e := root.Lookup(ctx, "plain", &a)
	if e != 0 || a.Size != 20 {
		t.Fatalf("lookup: size %d, %v", a.Size, e)
	}
	defer n.Forget()
	h, _ := n.Open(ctx, syscall.O_RDWR)
	defer h.Release(ctx)
	if got, _ := readAll(t, h, 20); string(got) != "written beside shale" {
		t.Errorf("reads %q", got)
	}
	h.Write(ctx, []byte("WRITTEN"), 0)
	if b, _ := os.ReadFile(filepath.Join(dir, "plain")); string(b) != "WRITTEN beside shale" {
		t.Errorf("a plain file written through the layer holds %q, want it plain", b)
	}
	n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize}, &a)
	h.Write(ctx, []byte("now compressed"), 0)
	b, _ := os.ReadFile(filepath.Join(dir, "plain"))
	if !bytes.HasPrefix(b, magic[:]) {
		t.Errorf("emptied and written again, the lower file holds %q, want the layer's format", b)
	}
	checkFresh(t, dir, "plain", []byte("now compressed"))
}

// SEEK_DATA and SEEK_HOLE see holes at page granularity, inside blocks
// too.
func TestSeek(t *testing.T) {
	root := open(t, t.TempDir())
	n, h := openFile(t, root, "f")
	defer n.Forget()
	defer h.Release(ctx)
	h.Write(ctx, []byte("a"), 3*blockSize+5000) // page 1 of block 3
	const data, hole = 3, 4
	for _, c := range []struct {
		off    int64
		whence int
		want   int64
		e      layer.Errno
	}{
		{0, data, 3*blockSize + 4096, 0},
		{0, hole, 0, 0},
		{3*blockSize + 4096, hole, 3*blockSize + 5001, 0},
		{3*blockSize + 5001, data, 0, syscall.ENXIO},
		{3*blockSize + 5001, hole, 0, syscall.ENXIO},
	} {
		got, e := h.Lseek(ctx, c.off, c.whence)
		if got != c.want || e != c.e {
			t.Errorf("lseek(%d, %d) = %d, %v; want %d, %v", c.off, c.whence, got, e, c.want, c.e)
		}
	}
}
