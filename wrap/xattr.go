package wrap

import (
	"context"
	"strings"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Extended attributes through an XattrCodec (hooks.go); without one they
// pass through (layer.PassThrough). Every change is a lower Setxattr or
// Removexattr, which raises its Attrs event as before, so views see
// attribute changes as they did.

const (
	xattrNameMax = 255      // XATTR_NAME_MAX
	xattrSizeMax = 64 << 10 // XATTR_SIZE_MAX and XATTR_LIST_MAX: no lower value or list is longer
	xattrCreate  = 1        // XATTR_CREATE
	xattrReplace = 2        // XATTR_REPLACE
)

func (n *node) Getxattr(ctx context.Context, name string, dest []byte) (int, layer.Errno) {
	x := n.fs.xattrs
	if x == nil || !x.TakesXattr(name) {
		return n.Lower.Getxattr(ctx, name, dest)
	}
	if deniedTrusted(ctx, name) {
		return 0, syscall.ENODATA
	}
	id, e := n.loadXattrID(ctx) // ENODATA: nothing was ever set
	if e != 0 {
		return 0, n.fs.withoutXattrID(name, e)
	}
	lname, e := n.fs.lowerXattrName(id, name, syscall.ENODATA)
	if e != 0 {
		return 0, e
	}
	stored, e := getAll(func(b []byte) (int, layer.Errno) { return n.Lower.Getxattr(ctx, lname, b) })
	if e != 0 {
		return 0, e
	}
	v, err := x.OpenXattr(id, name, stored)
	if err != nil {
		n.fs.log.Error("wrap: extended attribute does not decode", "token", n.Token(), "lower", lname, "err", err)
		return 0, syscall.EIO
	}
	return copyOut(dest, v)
}

func (n *node) Setxattr(ctx context.Context, name string, value []byte, flags uint32) layer.Errno {
	x := n.fs.xattrs
	if x == nil || !x.TakesXattr(name) {
		return n.Lower.Setxattr(ctx, name, value, flags)
	}
	if deniedTrusted(ctx, name) {
		return syscall.EPERM
	}
	id, e := n.loadXattrID(ctx)
	fresh := e == syscall.ENODATA && flags&xattrReplace == 0
	if fresh {
		var err error
		if id, err = x.NewXattrID(); err != nil || len(id) != x.XattrIDSize() {
			return errnoOf(err, syscall.EIO)
		}
		e = 0
	}
	if e != 0 {
		return n.fs.withoutXattrID(name, e)
	}
	lname, e := n.fs.lowerXattrName(id, name, syscall.ERANGE)
	if e != 0 {
		return e
	}
	if fresh {
		// Only now, so that a name refused above leaves the file as it
		// was; another request may have given the file its identity
		// meanwhile.
		if id, e = n.putXattrID(ctx, id); e != 0 {
			return e
		}
		if lname, e = n.fs.lowerXattrName(id, name, syscall.ERANGE); e != 0 {
			return e
		}
	}
	stored, err := x.SealXattr(id, name, value)
	if err != nil {
		return errnoOf(err, syscall.EIO)
	}
	return n.Lower.Setxattr(ctx, lname, stored, flags)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (int, layer.Errno) {
	x := n.fs.xattrs
	if x == nil {
		return n.Lower.Listxattr(ctx, dest)
	}
	list, e := getAll(func(b []byte) (int, layer.Errno) { return n.Lower.Listxattr(ctx, b) })
	if e != 0 {
		return 0, e
	}
	var out, id []byte
	var idErr layer.Errno
	for lname := range strings.SplitSeq(string(list), "\x00") {
		name := lname
		switch {
		case lname == "" || lname == x.XattrIDName():
			continue
		case x.TakesXattr(lname):
			// Ours, or put there behind the layer's back: shown only if
			// it decodes. Without an identity (none, damaged, or not
			// readable by the caller) nothing does.
			if id == nil && idErr == 0 {
				id, idErr = n.loadXattrID(ctx)
			}
			if idErr != 0 {
				continue
			}
			var err error
			if name, err = x.DecodeXattrName(id, lname); err != nil || deniedTrusted(ctx, name) {
				continue
			}
		}
		out = append(append(out, name...), 0)
	}
	return copyOut(dest, out)
}

func (n *node) Removexattr(ctx context.Context, name string) layer.Errno {
	x := n.fs.xattrs
	if x == nil || !x.TakesXattr(name) {
		return n.Lower.Removexattr(ctx, name)
	}
	if deniedTrusted(ctx, name) {
		return syscall.EPERM
	}
	// The identity stays when the last attribute goes: harmless, and
	// one fewer race with a set.
	id, e := n.loadXattrID(ctx)
	if e != 0 {
		return n.fs.withoutXattrID(name, e)
	}
	lname, e := n.fs.lowerXattrName(id, name, syscall.ENODATA)
	if e != 0 {
		return e
	}
	return n.Lower.Removexattr(ctx, lname)
}

// lowerXattrName encodes name for the file of identity id; tooLong is the
// answer when the encoding is longer than a lower name may be: ERANGE to
// set it, as Linux answers a name over 255 bytes, and ENODATA to get or
// remove it (it cannot exist).
func (f *fs) lowerXattrName(id []byte, name string, tooLong layer.Errno) (string, layer.Errno) {
	lname, err := f.xattrs.EncodeXattrName(id, name)
	if err != nil {
		return "", errnoOf(err, syscall.EINVAL)
	}
	if len(lname) > xattrNameMax {
		return "", tooLong
	}
	return lname, 0
}

// withoutXattrID is the answer for name when the file's identity could
// not be had (e, from loadXattrID). For a file with none (ENODATA), a
// name the codec refuses whatever the identity is still refused as it
// would be with one: a namespace alone is EINVAL, as Linux answers (the
// kernel in front of a FUSE view leaves that check to the file system),
// not ENODATA.
func (f *fs) withoutXattrID(name string, e layer.Errno) layer.Errno {
	if e != syscall.ENODATA {
		return e
	}
	if _, err := f.xattrs.EncodeXattrName(make([]byte, f.xattrs.XattrIDSize()), name); err != nil {
		return errnoOf(err, syscall.EINVAL)
	}
	return e
}

// loadXattrID returns the file's identity for the XattrCodec, the one
// remembered or read: ENODATA if it has none yet, EIO if it is damaged.
func (n *node) loadXattrID(ctx context.Context) ([]byte, layer.Errno) {
	n.mu.Lock()
	id := n.xattrID
	n.mu.Unlock()
	if id != nil {
		return id, 0
	}
	x := n.fs.xattrs
	b := make([]byte, x.XattrIDSize()+1) // room for one byte too many
	k, e := n.Lower.Getxattr(ctx, x.XattrIDName(), b)
	if e == syscall.ERANGE || e == 0 && k != x.XattrIDSize() {
		n.fs.log.Error("wrap: a file's extended attribute identity has the wrong length: its attributes cannot be decoded", "token", n.Token(), "len", k)
		return nil, syscall.EIO
	}
	if e != 0 {
		return nil, e
	}
	return n.keepXattrID(b[:k]), 0
}

// putXattrID gives the file identity id, unless another request gave it
// one first; it returns the one the file has.
func (n *node) putXattrID(ctx context.Context, id []byte) ([]byte, layer.Errno) {
	switch e := n.Lower.Setxattr(ctx, n.fs.xattrs.XattrIDName(), id, xattrCreate); e {
	case 0:
		return n.keepXattrID(id), 0
	case syscall.EEXIST:
		return n.loadXattrID(ctx)
	default:
		return nil, e
	}
}

// keepXattrID remembers id as the file's identity, unless one is
// remembered already, and returns the one remembered.
func (n *node) keepXattrID(id []byte) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.xattrID == nil {
		n.xattrID = id
	}
	return n.xattrID
}

// deniedTrusted tells a request for a trusted.* attribute by a caller
// other than root. Linux keeps them for CAP_SYS_ADMIN, and a kernel in
// front of a FUSE view checks gets and sets, but not listings, nor does a
// 9P client; once a codec stores them under names of its own, the lower
// file system no longer guards them either.
func deniedTrusted(ctx context.Context, name string) bool {
	c, ok := layer.CallerOf(ctx)
	return ok && c.Uid != 0 && strings.HasPrefix(name, "trusted.")
}

// getAll reads a whole lower value or name list with get, which works
// like getxattr(2).
func getAll(get func([]byte) (int, layer.Errno)) ([]byte, layer.Errno) {
	k, e := get(nil)
	if e != 0 || k == 0 {
		return nil, e
	}
	b := make([]byte, k)
	if k, e = get(b); e == syscall.ERANGE {
		// It grew meanwhile; none is longer than this.
		b = make([]byte, xattrSizeMax)
		k, e = get(b)
	}
	if e != 0 {
		return nil, e
	}
	if k > len(b) {
		return nil, syscall.EIO
	}
	return b[:k], 0
}

// copyOut answers like getxattr(2): the size for a zero-length dest,
// ERANGE for one too small.
func copyOut(dest, v []byte) (int, layer.Errno) {
	if len(dest) == 0 {
		return len(v), 0
	}
	if len(dest) < len(v) {
		return 0, syscall.ERANGE
	}
	return copy(dest, v), 0
}
