package volume

import (
	"context"
	"encoding/json"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// dirStream is a directory's listing as one read of its entries gave it:
// offsets are places in that list, so a listing goes on where it was
// whatever changes meanwhile (as a snapshot can).
type dirStream struct {
	ents []layer.DirEntry
	pos  int
}

func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	in, err := n.fs.getInode(ctx, n.ino)
	if err != nil {
		return nil, n.fs.errnoOf("opendir", err)
	}
	if !in.isDir() {
		return nil, syscall.ENOTDIR
	}
	cctx, cancel := n.fs.ctx(ctx)
	defer cancel()
	prefix := n.fs.k.dir(n.ino)
	kvs, _, err := n.fs.eng.List(cctx, prefix, 0)
	if err != nil {
		return nil, n.fs.errnoOf("readdir", err)
	}
	parent := in.Parent
	if parent == 0 {
		parent = n.ino
	}
	ents := []layer.DirEntry{
		{Name: ".", Ino: n.ino, Type: syscall.S_IFDIR},
		{Name: "..", Ino: parent, Type: syscall.S_IFDIR},
	}
	for _, kv := range kvs {
		var d Dirent
		if err := json.Unmarshal(kv.Val, &d); err != nil {
			return nil, n.fs.errnoOf("readdir", err)
		}
		ents = append(ents, layer.DirEntry{Name: kv.Key[len(prefix):], Ino: d.Ino, Type: d.Type})
	}
	for i := range ents {
		ents[i].Off = uint64(i + 1)
	}
	return &dirStream{ents: ents}, 0
}

func (d *dirStream) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if d.pos >= len(d.ents) {
		return layer.DirEntry{}, false, 0
	}
	d.pos++
	return d.ents[d.pos-1], true, 0
}

func (d *dirStream) Seek(ctx context.Context, off uint64) layer.Errno {
	d.pos = int(min(off, uint64(len(d.ents))))
	return 0
}

func (d *dirStream) Fsync(ctx context.Context, datasync bool) layer.Errno { return 0 }
func (d *dirStream) Close()                                               {}
