package remote

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// xattrwalk opens name's value (the list of names for "") on a new fid
// and returns its size.
func (c *conn) xattrwalk(fid uint32, name string) (uint32, uint64, error) {
	nf := c.newFid()
	var b p9wire.Enc
	b.U32(fid)
	b.U32(nf)
	b.Str(name)
	d, err := c.rpc(p9wire.Txattrwalk, b.B)
	if err != nil {
		c.putFid(nf)
		return 0, 0, err
	}
	size := d.U64()
	if d.Err != nil {
		c.fail(p9wire.ErrProto)
		return 0, 0, errLost
	}
	return nf, size, nil
}

// readXattr reads name's value into dest; an empty dest asks for its size.
func (n *node) readXattr(ctx context.Context, name string, dest []byte) (int, layer.Errno) {
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return 0, e
	}
	xfid, size, err := c.xattrwalk(fid, name)
	if err != nil {
		e := errno(err)
		if e == syscall.EINVAL && name != "" {
			// Servers built on hugelgupf/p9 v0.3.0 answer every failed
			// Txattrwalk so; getxattr(2) has no EINVAL for a valid name.
			e = syscall.ENODATA
		}
		return 0, e
	}
	defer c.clunk(xfid)
	if name == "" && size == 1 {
		// Those servers list no names as one empty one.
		var b [1]byte
		if k, err := c.readAt(xfid, 0, b[:], 0); err == nil && k == 1 && b[0] == 0 {
			return 0, 0
		}
	}
	if len(dest) == 0 {
		return int(size), 0
	}
	if size > uint64(len(dest)) {
		return 0, syscall.ERANGE
	}
	k, err := c.readAt(xfid, 0, dest[:size], 0)
	if err != nil {
		return 0, errno(err)
	}
	return k, 0
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
	xfid, _, err := c.walk(fid, nil)
	if err != nil {
		return errno(err)
	}
	var b p9wire.Enc
	b.U32(xfid)
	b.Str(name)
	b.U64(uint64(len(value)))
	b.U32(flags)
	if _, err := c.rpc(p9wire.Txattrcreate, b.B); err != nil {
		c.clunk(xfid)
		return errno(err)
	}
	if len(value) > 0 {
		if _, err := c.writeAt(xfid, 0, value, 0); err != nil {
			c.clunk(xfid)
			return errno(err)
		}
	}
	err = c.clunk(xfid)
	n.fs.cc.dropAttrs(n.tok.Ino) // ctime, and ACLs' mode bits, even if it failed half way
	if err != nil {
		return errno(err)
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
