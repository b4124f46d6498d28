package volume

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestGC: overwritten and removed files' blocks are freed once old
// enough, and objects no inode names (a write-back that never swapped its
// blocks in) too; what files use stays, and a second collector waits its
// turn.
func TestGC(t *testing.T) {
	lower := testVolume(t, 4096)
	fs, root := mount(t, lower)
	u, _ := ParseURL(lower)
	keep := bytes.Repeat([]byte("k"), 3*4096)
	f := writeFile(t, root, "f", bytes.Repeat([]byte("a"), 2*4096))
	h, e := f.Open(ctx0, 0o1|0o1000) // O_WRONLY|O_TRUNC
	must(t, e)
	_, e = h.Write(ctx0, keep, 0)
	must(t, e)
	must(t, h.Release(ctx0))
	writeFile(t, root, "g", bytes.Repeat([]byte("g"), 4096))
	must(t, root.Unlink(ctx0, "g"))
	orphan, err := fs.blocks.put(ctx0, []byte("never swapped in"))
	if err != nil {
		t.Fatal(err)
	}

	r, err := GC(ctx0, u, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if r.Objects != 0 || r.Waiting != 4 {
		t.Fatalf("with an hour's delay: %+v, want nothing freed and 4 objects waiting (2 overwritten, 1 removed, 1 orphan)", r)
	}
	r, err = GC(ctx0, u, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Objects != 4 || r.Orphans != 1 || r.Records != 2 || r.Bytes != 3*4096+int64(len("never swapped in")) {
		t.Fatalf("gc freed %+v, want 4 objects (1 orphan, 2 records) of %d bytes", r, 3*4096+len("never swapped in"))
	}
	fs.blocks.cache.drop(orphan)
	if _, err := fs.blocks.get(ctx0, orphan, 0); err == nil {
		t.Fatal("the orphan is still there")
	}
	// What the file uses stays: read on a client with no cached block.
	_, root2 := mount(t, lower)
	if got := readFile(t, lookup(t, root2, "f")); !bytes.Equal(got, keep) {
		t.Fatalf("after gc the file reads %d bytes, not its %d", len(got), len(keep))
	}
	if r, err := GC(ctx0, u, 0); err != nil || r.Objects != 0 {
		t.Fatalf("second gc: %+v %v", r, err)
	}
	unlock, err := fs.eng.Lock(ctx0, fs.k.p+"gc")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := GC(ctx0, u, 0); !errors.Is(err, ErrCollecting) {
		t.Fatalf("gc while another collects: %v, want ErrCollecting", err)
	}
}
