package remote

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// xattrMax is the largest value Linux has (XATTR_SIZE_MAX): one the
// server says is larger is not cached.
const xattrMax = 64 << 10

// readXattr reads name's value (the list of names for "") into dest; an
// empty dest asks for its size. Answers are cached, absent names too:
// the kernel asks for security.capability and ACLs on many operations.
func (n *node) readXattr(ctx context.Context, name string, dest []byte) (int, layer.Errno) {
	id := identOf(ctx)
	cc := n.fs.cc
	if v, absent, ok := cc.Xattr(n.tok.Ino, name, id.uid); ok {
		n.fs.hit(kindXattr)
		if absent {
			return 0, syscall.ENODATA
		}
		return xattrOut(v, dest)
	}
	n.fs.miss(kindXattr)
	since := cc.Snap()
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return 0, e
	}
	xfid, size, err := c.Xattrwalk(fid, name)
	if err != nil {
		e := session.Errno(err)
		if e == syscall.EINVAL && name != "" {
			// Servers built on hugelgupf/p9 v0.3.0 answer every failed
			// Txattrwalk so; getxattr(2) has no EINVAL for a valid name.
			e = syscall.ENODATA
		}
		if e == syscall.ENODATA {
			cc.PutXattr(since, n.tok.Ino, n.tok.Gen, name, id.uid, nil, true)
		}
		return 0, e
	}
	defer c.Clunk(xfid)
	// What is kept is read whole, so that the read after a size probe
	// is a hit.
	keep := cc.On.Load() && size <= xattrMax
	quirk := name == "" && size == 1 // hugelgupf/p9's servers list no names as one empty one
	if !keep && !quirk {
		if len(dest) == 0 {
			return int(size), 0
		}
		if size > uint64(len(dest)) {
			return 0, syscall.ERANGE
		}
	}
	v := make([]byte, size)
	k, err := c.ReadAt(xfid, 0, v, 0)
	if err != nil {
		return 0, session.Errno(err)
	}
	v = v[:k]
	if quirk && k == 1 && v[0] == 0 {
		v = nil
	}
	if keep {
		cc.PutXattr(since, n.tok.Ino, n.tok.Gen, name, id.uid, v, false)
	}
	return xattrOut(v, dest)
}

// xattrOut answers getxattr(2) with v: its size for an empty dest.
func xattrOut(v, dest []byte) (int, layer.Errno) {
	if len(dest) == 0 {
		return len(v), 0
	}
	if len(v) > len(dest) {
		return 0, syscall.ERANGE
	}
	return copy(dest, v), 0
}

func (n *node) Getxattr(ctx context.Context, name string, dest []byte) (int, layer.Errno) {
	if name == "" {
		return 0, syscall.EINVAL // "" would list the names
	}
	return n.readXattr(ctx, name, dest)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (int, layer.Errno) {
	return n.readXattr(ctx, "", dest)
}

// writeXattr sets name to value with setxattr(2) flags: Txattrcreate turns
// a clone of the node's fid into the value, written with Twrite, and the
// Tclunk that ends it answers whether the server could set it. A nil
// value of size 0 removes the attribute, as the kernel's 9P client does.
func (n *node) writeXattr(ctx context.Context, name string, value []byte, flags uint32) layer.Errno {
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return e
	}
	xfid, _, err := c.Walk(fid, nil)
	if err != nil {
		return session.Errno(err)
	}
	if err := c.Do(&p9wire.Xattrcreate{Fid: xfid, Name: name, Size: uint64(len(value)), Flags: flags}); err != nil {
		c.Clunk(xfid)
		return session.Errno(err)
	}
	if len(value) > 0 {
		if _, err := c.WriteAt(xfid, 0, value, 0); err != nil {
			c.Clunk(xfid)
			return session.Errno(err)
		}
	}
	err = c.Clunk(xfid)
	n.fs.cc.DropAttrs(n.tok.Ino) // ctime, and ACLs' mode bits, even if it failed half way
	if err != nil {
		return session.Errno(err)
	}
	n.fs.raise(ctx, layer.Attrs, n.tok, "")
	return 0
}

// Setxattr: an empty value with XATTR_REPLACE removes the attribute
// rather than empty it, as 9P cannot tell that from Removexattr: both are
// a Txattrcreate of size 0 with XATTR_REPLACE (see the package doc).
func (n *node) Setxattr(ctx context.Context, name string, value []byte, flags uint32) layer.Errno {
	if name == "" {
		return syscall.EINVAL
	}
	return n.writeXattr(ctx, name, value, flags)
}

func (n *node) Removexattr(ctx context.Context, name string) layer.Errno {
	if name == "" {
		return syscall.EINVAL
	}
	// 9P has no removexattr; so that removing a missing attribute fails
	// as removexattr(2) does, rather than succeed as a set of nothing.
	if _, e := n.readXattr(ctx, name, nil); e != 0 {
		return e
	}
	return n.writeXattr(ctx, name, nil, unix.XATTR_REPLACE)
}
