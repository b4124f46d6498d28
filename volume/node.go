package volume

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// node is an inode of the volume. It holds nothing but its number: every
// operation reads what it needs from etcd (or the client's open file).
type node struct {
	fs  *FS
	ino uint64

	mu   sync.Mutex
	last *Inode // as last read, for a stat after its removal (fstat)
}

// rootNode is the root the backend hands the stack: Close ends the
// volume's connection (stack.CloseLower).
type rootNode struct{ node }

func (r *rootNode) Close() error { return r.fs.Close() }

// FSOf returns the volume a node of it belongs to.
func FSOf(n layer.Node) (*FS, bool) {
	if v, ok := asNode(n); ok {
		return v.fs, true
	}
	return nil, false
}

func asNode(n layer.Node) (*node, bool) {
	switch v := n.(type) {
	case *node:
		return v, true
	case *rootNode:
		return &v.node, true
	}
	return nil, false
}

func (n *node) Token() layer.Token { return token(n.ino) }
func (n *node) Forget()            {}

// KeepsOffsets: the volume is the bottom of its stack.
func (n *node) KeepsOffsets() bool { return true }

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if f := n.fs.openFile(n.ino); f != nil {
		if f.attr(ctx, out) {
			return 0
		}
	}
	in, err := n.fs.getInode(ctx, n.ino)
	if err == syscall.ENOENT {
		// Removed, but still open here: what the open file knows, or
		// what was last seen of it.
		if f := n.fs.openFile(n.ino); f != nil {
			n.fs.gone(n.ino)
			if f.attr(ctx, out) {
				return 0
			}
		}
		n.mu.Lock()
		last := n.last
		n.mu.Unlock()
		if last != nil && last.isDir() {
			n.fs.fill(n.ino, last, out)
			out.Nlink = 0
			return 0
		}
		// A name the kernel still caches, whose file another client
		// removed or replaced: ESTALE has the kernel look the path up
		// again (a stat, an open), rather than fail with ENOENT.
		return syscall.ESTALE
	}
	if err != nil {
		return n.fs.errnoOf("getattr", err)
	}
	n.mu.Lock()
	n.last = in
	n.mu.Unlock()
	n.fs.fill(n.ino, in, out)
	return 0
}

// validName refuses names the kernel would never send.
func validName(name string) layer.Errno {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return syscall.EINVAL
	}
	if len(name) > 255 {
		return syscall.ENAMETOOLONG
	}
	return 0
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	if e := validName(name); e != 0 {
		return nil, e
	}
	key := n.fs.k.dirent(n.ino, name)
	// From the cache if it knows; a file it names that is gone has it
	// read again.
	for try := 0; ; try++ {
		v, ok := n.fs.meta.get(n.fs.k, key)
		if !ok || try > 0 {
			vs, err := n.fs.read(ctx, key)
			if err != nil {
				return nil, n.fs.errnoOf("lookup", err)
			}
			v, ok = vs[0], false
		}
		if v.Val == nil {
			return nil, syscall.ENOENT
		}
		var d Dirent
		if err := json.Unmarshal(v.Val, &d); err != nil {
			return nil, n.fs.errnoOf("lookup", err)
		}
		c := &node{fs: n.fs, ino: d.Ino}
		e := c.Getattr(ctx, nil, out)
		if e == syscall.ESTALE && ok {
			continue
		}
		if e != 0 {
			return nil, e
		}
		return c, 0
	}
}

// unchecked refuses callers that a frontend did not check (Caller.Check:
// shale serve's 9P clients) unless they are root: the volume does not
// check permissions itself yet, and must not act for them unchecked.
func unchecked(ctx context.Context) layer.Errno {
	if c, ok := layer.CallerOf(ctx); ok && c.Check && c.Uid != 0 {
		return syscall.EACCES
	}
	return 0
}

// caller is who makes a new object: ctx's caller, or this process.
func caller(ctx context.Context) (uid, gid, umask uint32) {
	if c, ok := layer.CallerOf(ctx); ok {
		return c.Uid, c.Gid, c.Umask
	}
	return uint32(os.Geteuid()), uint32(os.Getegid()), 0
}

// make creates name in n as a new inode in; it fills the owner, the mode's
// umask and the setgid directory's group as a local file system would.
func (n *node) make(ctx context.Context, name string, in *Inode, out *layer.Attr) (*node, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	if e := validName(name); e != 0 {
		return nil, e
	}
	ino, err := n.fs.newIno(ctx)
	if err != nil {
		return nil, n.fs.errnoOf("create", err)
	}
	uid, gid, umask := caller(ctx)
	in.Uid, in.Gid = uid, gid
	typ := in.Mode & syscall.S_IFMT
	e := n.fs.update(ctx, "create", func(t *ntx) error {
		// The entry, the directory and its default ACL in one request.
		v, err := t.read([]uint64{n.ino}, t.fs.k.dirent(n.ino, name), t.fs.k.xattr(n.ino, aclDefault))
		if err != nil {
			return err
		}
		dir, err := t.dir(n.ino)
		if err != nil {
			return err
		}
		if dir.Nlink == 0 {
			return syscall.ENOENT // removed while we held it
		}
		if v[0] != nil {
			return syscall.EEXIST
		}
		nin := *in
		if typ != syscall.S_IFLNK {
			t.newMode(v[1], ino, &nin, umask)
		}
		if dir.Mode&syscall.S_ISGID != 0 {
			nin.Gid = dir.Gid
			if typ == syscall.S_IFDIR {
				nin.Mode |= syscall.S_ISGID
			}
		}
		if typ == syscall.S_IFDIR {
			nin.Nlink, nin.Parent = 2, n.ino
			dir.Nlink++
			t.madeDirs = append(t.madeDirs, ino)
		}
		t.newInode(ino, &nin)
		t.addEntry(n.ino, name, ino, typ)
		*in = nin
		return nil
	})
	if e != 0 {
		return nil, e
	}
	n.fs.raise(ctx, layer.Entries, n.ino, name)
	n.fs.fill(ino, in, out)
	return &node{fs: n.fs, ino: ino, last: in}, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.make(ctx, name, &Inode{Mode: syscall.S_IFDIR | mode&0o7777}, out)
	return nodeOrNil(c, e)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
	case 0:
		mode |= syscall.S_IFREG
	default:
		return nil, syscall.EINVAL
	}
	c, e := n.make(ctx, name, &Inode{Mode: mode, Nlink: 1, Rdev: dev}, out)
	return nodeOrNil(c, e)
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if len(target) == 0 {
		return nil, syscall.ENOENT
	}
	if len(target) >= 4096 {
		return nil, syscall.ENAMETOOLONG
	}
	c, e := n.make(ctx, name, &Inode{Mode: syscall.S_IFLNK | 0o777, Nlink: 1, Target: target}, out)
	return nodeOrNil(c, e)
}

// nodeOrNil keeps a nil *node from becoming a non-nil layer.Node.
func nodeOrNil(c *node, e layer.Errno) (layer.Node, layer.Errno) {
	if e != 0 {
		return nil, e
	}
	return c, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	c, e := n.make(ctx, name, &Inode{Mode: syscall.S_IFREG | mode&0o7777, Nlink: 1}, out)
	if e == syscall.EEXIST && flags&unix.O_EXCL == 0 {
		// Made by someone else since the kernel looked: open it.
		l, e := n.Lookup(ctx, name, out)
		if e != 0 {
			return nil, nil, e
		}
		if out.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return nil, nil, syscall.EEXIST
		}
		h, e := l.Open(ctx, flags)
		if e != 0 {
			return nil, nil, e
		}
		return l, h, 0
	}
	if e != 0 {
		return nil, nil, e
	}
	c.mu.Lock()
	known := c.last
	c.mu.Unlock()
	h, e := c.open(ctx, flags&^unix.O_TRUNC, known)
	if e != 0 {
		return nil, nil, e
	}
	return c, h, 0
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	tn, ok := asNode(target)
	if !ok || tn.fs != n.fs {
		return nil, syscall.EXDEV
	}
	if e := validName(name); e != 0 {
		return nil, e
	}
	var in Inode
	e := n.fs.update(ctx, "link", func(t *ntx) error {
		if err := t.load(n.ino, tn.ino); err != nil {
			return err
		}
		dir, err := t.dir(n.ino)
		if err != nil {
			return err
		}
		tin, err := t.inode(tn.ino)
		if err != nil {
			return err
		}
		if tin.isDir() {
			return syscall.EPERM
		}
		if dir.Nlink == 0 || tin.Nlink == 0 {
			return syscall.ENOENT
		}
		if tin.Nlink >= 65000 {
			return syscall.EMLINK
		}
		d, err := t.dirents(nil, n.ino, name)
		if err != nil {
			return err
		}
		if d[0] != nil {
			return syscall.EEXIST
		}
		tin.Nlink++
		t.touch(tn.ino, 'c')
		t.addEntry(n.ino, name, tn.ino, tin.Mode&syscall.S_IFMT)
		in = *tin
		return nil
	})
	if e != 0 {
		return nil, e
	}
	n.fs.raise(ctx, layer.Entries, n.ino, name)
	n.fs.raise(ctx, layer.Attrs, tn.ino, "")
	n.fs.fill(tn.ino, &in, out)
	return &node{fs: n.fs, ino: tn.ino}, 0
}

func (n *node) Unlink(ctx context.Context, name string) layer.Errno {
	return n.remove(ctx, name, false)
}
func (n *node) Rmdir(ctx context.Context, name string) layer.Errno { return n.remove(ctx, name, true) }

// remove takes name out of n, and its inode with its last link.
func (n *node) remove(ctx context.Context, name string, isDir bool) layer.Errno {
	if e := unchecked(ctx); e != 0 {
		return e
	}
	if e := validName(name); e != 0 {
		return e
	}
	var gone uint64
	e := n.fs.update(ctx, "remove", func(t *ntx) error {
		d, err := t.dirents([]uint64{n.ino}, n.ino, name)
		if err != nil {
			return err
		}
		if _, err := t.dir(n.ino); err != nil {
			return err
		}
		if d[0] == nil {
			return syscall.ENOENT
		}
		gone = d[0].Ino
		in, err := t.inode(gone)
		if err != nil {
			return err
		}
		if err := removable(in, isDir); err != nil {
			return err
		}
		t.delEntry(n.ino, name)
		if in.isDir() {
			t.inodes[n.ino].Nlink--
		}
		t.unlinkInode(gone)
		return nil
	})
	if e != 0 {
		return e
	}
	n.fs.raise(ctx, layer.Attrs, gone, "")
	n.fs.raise(ctx, layer.Entries, n.ino, name)
	return 0
}

// removable says whether in may go by unlink (isDir false) or rmdir.
func removable(in *Inode, isDir bool) error {
	switch {
	case isDir && !in.isDir():
		return syscall.ENOTDIR
	case !isDir && in.isDir():
		return syscall.EISDIR
	case isDir && in.Entries > 0:
		return syscall.ENOTEMPTY
	}
	return nil
}

func (n *node) Readlink(ctx context.Context) ([]byte, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	in, err := n.fs.getInode(ctx, n.ino)
	if err != nil {
		return nil, n.fs.errnoOf("readlink", err)
	}
	if in.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		return nil, syscall.EINVAL
	}
	return in.Target, 0
}

func (n *node) Statfs(ctx context.Context, out *layer.Statfs) layer.Errno {
	// An object store has no fixed size: report a large one, as s3fs and
	// JuiceFS do, so that programs that check free space go on.
	const total = 1 << 50
	bs := uint64(n.fs.f.BlockSize)
	*out = layer.Statfs{Blocks: total / bs, Bfree: total / bs, Bavail: total / bs,
		Files: 1 << 40, Ffree: 1 << 40, Bsize: uint32(bs), Frsize: uint32(bs), NameLen: 255}
	return 0
}
