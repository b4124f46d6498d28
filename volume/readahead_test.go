package volume

import (
	"bytes"
	"testing"
	"time"

	"github.com/shalefs/shale/layer"
)

const bs, nb = 64 << 10, 12 // the tests' block size, and the file's blocks

// freshFile writes a file of nb blocks and opens it on a mount of its
// own, with nothing cached.
func freshFile(t *testing.T, seed byte) (*FS, layer.Node, layer.Handle, []byte) {
	lower := testVolume(t, bs)
	data := pattern(seed, nb*bs)
	_, root := mount(t, lower)
	writeFile(t, root, "f", data)
	fs, root := mount(t, lower)
	n := lookup(t, root, "f")
	h, e := n.Open(ctx0, 0)
	must(t, e)
	t.Cleanup(func() { h.Release(ctx0) })
	return fs, n, h, data
}

// TestReadAhead: a fresh mount reading a file in order has the blocks
// after the one it reads fetched before it asks for them, each once.
func TestReadAhead(t *testing.T) {
	fs, n, h, data := freshFile(t, 3)
	got := make([]byte, 0, len(data))
	buf := make([]byte, 16<<10) // as the kernel asks: a piece at a time
	read := func(upto int) {
		for len(got) < upto {
			k, e := h.Read(ctx0, buf, int64(len(got)))
			must(t, e)
			if k == 0 {
				t.Fatalf("read 0 bytes at %d", len(got))
			}
			got = append(got, buf[:k]...)
		}
	}
	read(bs + bs/2) // into block 1
	in, err := fs.getInode(ctx0, attr(t, n).Ino)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{2, 3, 4, 5} {
		id := in.Blocks[i].ID
		for deadline := time.Now().Add(60 * time.Second); !fs.blocks.cache.has(id); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("block %d not fetched ahead of a sequential reader after 60s (%d read-ahead fetches)", i, fs.blocks.fetches.ahead.Load())
			}
		}
	}
	read(len(data))
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs from what was written")
	}
	if g := fs.blocks.fetches.gets.Load(); g != nb {
		t.Errorf("%d S3 GETs for %d blocks, want each fetched once", g, nb)
	}
	if a := fs.blocks.fetches.ahead.Load(); a == 0 {
		t.Error("no read-ahead fetches counted")
	}
}

// TestNoReadAheadRandom: a reader jumping about fetches only what it reads.
func TestNoReadAheadRandom(t *testing.T) {
	fs, _, h, data := freshFile(t, 4)
	buf := make([]byte, 16<<10)
	order := []int{9, 2, 6, 0, 11, 4}
	for _, i := range order {
		off := int64(i*bs + bs/4)
		k, e := h.Read(ctx0, buf, off)
		must(t, e)
		if !bytes.Equal(buf[:k], data[off:off+int64(len(buf))]) {
			t.Fatalf("block %d: read differs", i)
		}
	}
	if a := fs.blocks.fetches.ahead.Load(); a != 0 {
		t.Errorf("%d read-ahead fetches for a random reader, want none", a)
	}
	if g := fs.blocks.fetches.gets.Load(); g != int64(len(order)) {
		t.Errorf("%d S3 GETs for %d blocks read", g, len(order))
	}
}
