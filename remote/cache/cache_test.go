package cache

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/shalefs/shale/layer"
)

// What a client cached on disk, with its journal position, comes back
// whole in the next client of the directory, once; a put that crossed an
// invalidation is refused.
func TestDiskSaveRestore(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	d, err := OpenDisk(dir, 64<<20, "srv", log)
	if err != nil {
		t.Fatal(err)
	}
	c := New(100, d)
	c.On.Store(true)
	s := c.Snap()
	c.PutLookup(s, 1, "f", 0, 2, 1, &layer.Attr{Mode: 0o100644, Size: BlockSize + 3})
	data := bytes.Repeat([]byte("y"), BlockSize+3)
	c.PutData(s, 2, 1, 0, data, true)
	stale := c.Snap()
	c.DropAttrs(3)
	c.PutAttr(stale, 3, 1, &layer.Attr{Size: 9}) // crossed the drop: refused
	if _, _, ok := c.Attr(3); ok {
		t.Fatal("a put that crossed an invalidation was kept")
	}
	if err := d.Save(&JournalPos{UUID: "u", Epoch: 4, Seq: 5}, c); err != nil {
		t.Fatal(err)
	}

	d2, err := OpenDisk(dir, 64<<20, "srv", log)
	if err != nil {
		t.Fatal(err)
	}
	c2 := New(100, d2)
	c2.On.Store(true)
	pos, ok := d2.Restore(c2)
	if !ok || pos != (JournalPos{"u", 4, 5}) {
		t.Fatalf("restored %+v, %v", pos, ok)
	}
	buf := make([]byte, 2*BlockSize)
	if k, ok := c2.Read(2, 1, buf, 0); !ok || !bytes.Equal(buf[:k], data) {
		t.Fatalf("restored data: %d bytes, %v", k, ok)
	}
	if child, _, _, found, ok := c2.Lookup(1, "f", 0); !ok || !found || child != 2 {
		t.Fatalf("restored lookup: %d %v %v", child, found, ok)
	}
	if _, ok := d2.Restore(c2); ok {
		t.Fatal("restored twice")
	}
	d2.Save(nil, c2)
	d3, err := OpenDisk(dir, 64<<20, "other", log)
	if err != nil {
		t.Fatal(err)
	}
	defer d3.Save(nil, New(1, d3))
	if _, ok := d3.Restore(New(100, d3)); ok {
		t.Fatal("a state saved without a journal was restored")
	}
}

// Who may read a file survives a change of its data (a write cannot
// change its permission bits, owner or ACL), not one of its attributes;
// and a grant names the file's generation, so that a new file reusing a
// cached one's inode number gets it, not the old file's entry.
func TestReadGrants(t *testing.T) {
	c := New(100, NewMemBlocks(1<<20))
	c.On.Store(true)
	c.PutAttr(c.Snap(), 7, 1, &layer.Attr{Mode: 0o100644})
	c.Grant(c.Snap(), 7, 2, 1000, false) // a new file, number 7 again
	c.PutAttr(c.Snap(), 7, 2, &layer.Attr{Mode: 0o100644, Size: 3})
	if !c.MayRead(7, 2, 1000) {
		t.Fatal("the new file's grant went with the old file's entry")
	}
	c.DropData(7, 0, 0)
	if !c.MayRead(7, 2, 1000) {
		t.Fatal("a write dropped who may read the file")
	}
	if _, _, ok := c.Attr(7); ok {
		t.Fatal("a write left the attributes cached")
	}
	c.DropAttrs(7)
	if c.MayRead(7, 2, 1000) {
		t.Fatal("a change of attributes (a chmod) left who may read the file")
	}
}
