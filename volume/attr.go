package volume

import (
	"context"
	"syscall"

	"github.com/shalefs/shale/layer"
)

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if e := unchecked(ctx); e != 0 {
		return e
	}
	if in.Valid&layer.SetSize != 0 {
		// A size is data: it goes through the file as writes do, and is
		// written back at once.
		if e := n.truncate(ctx, h, in.Size); e != 0 {
			return e
		}
	}
	var res Inode
	e := n.fs.update(ctx, "setattr", func(t *ntx) error {
		a, err := t.inode(n.ino)
		if err != nil {
			return err
		}
		applyAttr(a, in, t.now)
		if in.Valid&layer.SetMode != 0 {
			if err := t.chmodACL(n.ino, a.Mode); err != nil {
				return err
			}
		}
		t.touch(n.ino, 0)
		res = *a
		return nil
	})
	if e != 0 {
		return e
	}
	kind := layer.Attrs
	if in.Valid&layer.SetSize != 0 {
		kind = layer.Data
	}
	n.fs.raise(ctx, kind, n.ino, "")
	if f := n.fs.openFile(n.ino); f != nil {
		f.setTimes(&res, in)
		if f.attr(ctx, out) {
			return 0
		}
	}
	n.fs.fill(n.ino, &res, out)
	return 0
}

// applyAttr changes a as in asks, at time now (ns), with the ctime a
// local file system gives.
func applyAttr(a *Inode, in *layer.SetAttr, now int64) {
	v := in.Valid
	if v&layer.SetMode != 0 {
		a.Mode = a.Mode&syscall.S_IFMT | in.Mode&0o7777
	}
	if v&layer.SetUid != 0 {
		a.Uid = in.Uid
	}
	if v&layer.SetGid != 0 {
		a.Gid = in.Gid
	}
	switch {
	case v&layer.SetAtimeNow != 0:
		a.Atime = now
	case v&layer.SetAtime != 0:
		a.Atime = in.Atime.UnixNano()
	}
	switch {
	case v&layer.SetMtimeNow != 0:
		a.Mtime = now
	case v&layer.SetMtime != 0:
		a.Mtime = in.Mtime.UnixNano()
	}
	a.Ctime = now
}

// truncate sets the file's size through its open file (file.go).
func (n *node) truncate(ctx context.Context, h layer.Handle, size uint64) layer.Errno {
	f, e := n.fs.acquire(ctx, n.ino, nil)
	if e != 0 {
		return e
	}
	defer n.fs.release(f)
	if e := f.truncate(ctx, size); e != 0 {
		return e
	}
	return f.writeBack(ctx)
}
