package volume

import (
	"context"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// Extended attributes are keys of their own (x/INO/NAME), changed in one
// transaction with the inode's ctime.

func (n *node) Getxattr(ctx context.Context, name string, dest []byte) (int, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return 0, e
	}
	if e := validXattr(name); e != 0 {
		return 0, e
	}
	// The kernel asks for security.capability before every write: the
	// cache (kept by the watch) answers, after the first read.
	key := n.fs.k.xattr(n.ino, name)
	v, ok := n.fs.meta.get(n.fs.k, key)
	if !ok {
		vs, err := n.fs.read(ctx, key)
		if err != nil {
			return 0, n.fs.errnoOf("getxattr", err)
		}
		v = vs[0]
	}
	if v.Val == nil {
		return 0, syscall.ENODATA
	}
	return sized(dest, v.Val)
}

// sized copies v to dest as the xattr calls do: a zero-length dest asks
// for the size; a short one is ERANGE.
func sized(dest, v []byte) (int, layer.Errno) {
	if len(dest) == 0 {
		return len(v), 0
	}
	if len(dest) < len(v) {
		return 0, syscall.ERANGE
	}
	return copy(dest, v), 0
}

// validXattr takes the namespaces Linux knows; others are EOPNOTSUPP,
// as from a local file system.
func validXattr(name string) layer.Errno {
	if name == "" || strings.ContainsRune(name, 0) {
		return syscall.EINVAL
	}
	if len(name) > 255 {
		return syscall.ERANGE
	}
	for _, ns := range []string{"user.", "trusted.", "security.", "system."} {
		if strings.HasPrefix(name, ns) && len(name) > len(ns) {
			return 0
		}
	}
	return syscall.EOPNOTSUPP
}

func (n *node) Setxattr(ctx context.Context, name string, value []byte, flags uint32) layer.Errno {
	if e := unchecked(ctx); e != 0 {
		return e
	}
	if e := validXattr(name); e != 0 {
		return e
	}
	if len(value) > 64<<10 {
		return syscall.E2BIG
	}
	var a acl
	if name == aclAccess || name == aclDefault {
		var err error
		if a, err = parseACL(value); err != nil {
			return syscall.EINVAL
		}
	}
	key := n.fs.k.xattr(n.ino, name)
	e := n.fs.update(ctx, "setxattr", func(t *ntx) error {
		in, err := t.inode(n.ino)
		if err != nil {
			return err
		}
		v, err := t.tx.Get(key)
		if err != nil {
			return err
		}
		switch {
		case flags&unix.XATTR_CREATE != 0 && v[0] != nil:
			return syscall.EEXIST
		case flags&unix.XATTR_REPLACE != 0 && v[0] == nil:
			return syscall.ENODATA
		}
		t.touch(n.ino, 'c')
		switch name {
		case aclAccess:
			// The ACL sets the mode; one that says no more than a mode
			// is kept as the mode alone, as Linux does.
			in.Mode = in.Mode&^0o777 | a.mode()
			if a.minimal() {
				t.tx.Delete(key)
				return nil
			}
		case aclDefault:
			if !in.isDir() {
				return syscall.EACCES
			}
		}
		t.tx.Put(key, value)
		return nil
	})
	if e == 0 {
		n.fs.raise(ctx, layer.Attrs, n.ino, "")
	}
	return e
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (int, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return 0, e
	}
	cctx, cancel := n.fs.ctx(ctx)
	defer cancel()
	prefix := n.fs.k.xattrs(n.ino)
	kvs, _, err := n.fs.eng.List(cctx, prefix, 0)
	if err != nil {
		return 0, n.fs.errnoOf("listxattr", err)
	}
	var list []byte
	for _, kv := range kvs {
		list = append(list, kv.Key[len(prefix):]...)
		list = append(list, 0)
	}
	return sized(dest, list)
}

func (n *node) Removexattr(ctx context.Context, name string) layer.Errno {
	if e := unchecked(ctx); e != 0 {
		return e
	}
	if e := validXattr(name); e != 0 {
		return e
	}
	key := n.fs.k.xattr(n.ino, name)
	e := n.fs.update(ctx, "removexattr", func(t *ntx) error {
		if _, err := t.inode(n.ino); err != nil {
			return err
		}
		v, err := t.tx.Get(key)
		if err != nil {
			return err
		}
		if v[0] == nil {
			return syscall.ENODATA
		}
		t.tx.Delete(key)
		t.touch(n.ino, 'c')
		return nil
	})
	if e == 0 {
		n.fs.raise(ctx, layer.Attrs, n.ino, "")
	}
	return e
}
