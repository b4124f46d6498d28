package volume

import (
	"context"
	"encoding/json"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// dirStream lists a directory. Entries come in name order (etcd's key
// order), and every offset handed out stands for its entry's name: a
// seek to one lists afresh the names after it, so a listing goes on
// where it was whatever was added or removed meanwhile.
//
// The entries are read at the first Next, not at the open: the kernel,
// told of a change between its OPENDIR and its READDIR, fetches the new
// mtime first, and would keep a listing read at the open as the one of
// that mtime until the next change.
type dirStream struct {
	n      *node
	loaded bool // ents holds the listing from the start or a Seek
	ents   []layer.DirEntry
	pos    int
	names  map[uint64]string // every offset handed out: the name it follows
	next   uint64
}

func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	in, err := n.fs.getInode(ctx, n.ino)
	if err != nil {
		return nil, n.fs.errnoOf("opendir", err)
	}
	if !in.isDir() {
		return nil, syscall.ENOTDIR
	}
	return &dirStream{n: n, names: map[uint64]string{}, next: 1}, 0
}

// load lists the entries after name ("": all, "." and ".." first).
func (d *dirStream) load(ctx context.Context, after string) layer.Errno {
	fs, ino := d.n.fs, d.n.ino
	in, err := fs.getInode(ctx, ino)
	if err != nil {
		return fs.errnoOf("opendir", err)
	}
	if !in.isDir() {
		return syscall.ENOTDIR
	}
	kvs, err := fs.entries(ctx, ino)
	if err != nil {
		return fs.errnoOf("readdir", err)
	}
	if after == "" {
		fs.accessed(ino, in) // a listing is a read (atime.go)
	}
	parent := in.Parent
	if parent == 0 {
		parent = ino
	}
	var ents []layer.DirEntry
	if after == "" {
		ents = append(ents, layer.DirEntry{Name: ".", Ino: ino, Type: syscall.S_IFDIR})
	}
	if after == "" || after == "." {
		ents = append(ents, layer.DirEntry{Name: "..", Ino: parent, Type: syscall.S_IFDIR})
	}
	dots := after == "" || after == "." || after == ".."
	for _, kv := range kvs {
		name := kv.Key
		if !dots && name <= after {
			continue
		}
		var de Dirent
		if err := json.Unmarshal(kv.Val, &de); err != nil {
			return fs.errnoOf("readdir", err)
		}
		ents = append(ents, layer.DirEntry{Name: name, Ino: de.Ino, Type: de.Type})
	}
	for i := range ents {
		ents[i].Off = d.next
		d.names[d.next] = ents[i].Name
		d.next++
	}
	d.ents, d.pos, d.loaded = ents, 0, true
	return 0
}

func (d *dirStream) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if !d.loaded {
		if e := d.load(ctx, ""); e != 0 {
			return layer.DirEntry{}, false, e
		}
	}
	if d.pos >= len(d.ents) {
		return layer.DirEntry{}, false, 0
	}
	d.pos++
	return d.ents[d.pos-1], true, 0
}

func (d *dirStream) Seek(ctx context.Context, off uint64) layer.Errno {
	if off == 0 {
		d.loaded, d.ents, d.pos = false, nil, 0 // read at the next Next
		return 0
	}
	if d.pos > 0 && d.ents[d.pos-1].Off == off {
		return 0 // where we are
	}
	name, ok := d.names[off]
	if !ok {
		return syscall.EINVAL
	}
	return d.load(ctx, name)
}

func (d *dirStream) Fsync(ctx context.Context, datasync bool) layer.Errno { return 0 }
func (d *dirStream) Close()                                               {}
