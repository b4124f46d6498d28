// Package hostfs is the bottom of every local stack: the layer interface
// over a directory of the host, confined to it.
//
// Confinement: every node holds an O_PATH file descriptor, and every
// operation names a single path component relative to a node's descriptor
// with O_NOFOLLOW/AT_SYMLINK_NOFOLLOW. No name containing "/", no "." or
// "..", and no symlink is ever resolved by the host on our behalf, and a
// rename elsewhere cannot redirect an operation, because nothing is looked
// up by path from the root. Whole-node operations that the *at calls do not
// offer (chmod, truncate, xattrs, reopen) go through /proc/self/fd/N, which
// the kernel resolves to the very inode the descriptor holds.
//
// Credentials: when shale runs as root and serves other users (allow_other
// with default_permissions), the kernel has already checked permissions, so
// operations run as root; but new objects must belong to the caller, with
// the group the lower file system would give them (setgid directories), so
// creating operations run on a locked thread with the caller's fsuid and
// fsgid. See creds.go.
//
// Check mode: a frontend that checks nothing itself (9P) sets Caller.Check,
// and then every operation that touches the host, handle operations
// included, runs on a locked thread with the caller's fsuid, fsgid and
// groups and, unless the caller is root, no capabilities: the host kernel
// checks it exactly as for a local program of that user (mode bits, ACLs,
// sticky directories, chown rules, setuid cleared on write, O_NOATIME).
// Shale's own bookkeeping (reopening evicted nodes, stats for events and
// tokens, inotify) still runs as the process. A shale not running as root
// cannot switch, and so serves in Check mode only its own user: any other
// uid gets EACCES.
package hostfs

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// FS is a host directory served as a layer.
type FS struct {
	dir     string
	rootDev uint64
	asRoot  bool      // we are root: create objects with the caller's fsuid/fsgid
	euid    uint32    // without asRoot, the only user Check callers may be
	own     procCreds // the process's credentials, to restore threads to
	fds     *fdCache
	st      *stack.Stack                 // raises its events, keeps its locks
	inotify atomic.Pointer[inotifyWatch] // while inotify watches (inotify.go)
	minted  minted                       // generations of files that have no other (gen.go)
}

// KeepsOffsets: the FS is the bottom of its stack.
func (n *node) KeepsOffsets() bool { return true }

// raise tells subscribers that tok changed, on behalf of ctx's view.
func (fs *FS) raise(ctx context.Context, kind layer.EventKind, tok layer.Token, name string) {
	fs.raiseRange(ctx, kind, tok, name, 0, 0)
}

// raiseRange is raise for a change of len bytes at off (len 0: all).
func (fs *FS) raiseRange(ctx context.Context, kind layer.EventKind, tok layer.Token, name string, off, len int64) {
	if !fs.st.Events().Active() {
		return
	}
	fs.st.Events().RaiseIn(ctx, layer.Event{Kind: kind, Token: tok, Name: name, View: layer.ViewOf(ctx), Off: off, Len: len})
}

// raiseGone tells subscribers about the file that name in dirfd is before
// it is removed or replaced: its link count will change.
func (fs *FS) raiseGone(ctx context.Context, dirfd int, name string) {
	if !fs.st.Events().Active() {
		return
	}
	var st unix.Statx_t
	if unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st) == nil {
		fs.raise(ctx, layer.Attrs, fs.token(dirfd, name, &st), "")
	}
}

// New opens dir as the bottom of st and returns its root node. It clears
// the process's umask: callers' umasks are applied per request (newMode).
func New(s *stack.Stack, dir string) (layer.Node, error) {
	// Callers' modes arrive unmasked with their umask beside (newMode);
	// the process's own umask would mask them a second time.
	unix.Umask(0)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	fs := &FS{dir: dir, asRoot: os.Geteuid() == 0, euid: uint32(os.Geteuid()), fds: newFdCache(fd), st: s}
	if fs.asRoot {
		if fs.own, err = ownCreds(); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	var st unix.Statx_t
	if err := statx(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s: %w", dir, err)
	}
	fs.rootDev = unix.Mkdev(st.Dev_major, st.Dev_minor)
	root := fs.newNode(fd, &st)
	root.pinned = true // it is the cache's mount descriptor, outside the ring
	return root, nil
}

// node is a host object held by an O_PATH descriptor, or by a file
// handle while the descriptor cache has evicted it (fds.go).
type node struct {
	fs    *FS
	token layer.Token
	dev   uint64

	mu     sync.Mutex
	fd     int              // -1 while evicted or after Forget
	fh     *unix.FileHandle // to reopen an evicted node
	users  int              // operations using fd now
	ref    bool             // used since the clock hand passed
	pinned bool             // never evicted
	slot   int              // index in the cache's ring, or -1
}

func (fs *FS) newNode(fd int, st *unix.Statx_t) *node {
	return &node{fs: fs, fd: fd, token: fs.tokenOf(fd, "", st, true), dev: unix.Mkdev(st.Dev_major, st.Dev_minor), slot: -1}
}

// token is the identity of the file st describes, which fd holds or, if
// name is not "", name in directory fd has.
func (fs *FS) token(fd int, name string, st *unix.Statx_t) layer.Token {
	return fs.tokenOf(fd, name, st, false)
}

// tokenOf is token, for a new node if hold is set (gen.go). Inodes of the
// root's device keep their number; others are mixed with their device so
// that submounts do not collide.
func (fs *FS) tokenOf(fd int, name string, st *unix.Statx_t, hold bool) layer.Token {
	dev := unix.Mkdev(st.Dev_major, st.Dev_minor)
	ino := st.Ino
	if dev != fs.rootDev {
		ino ^= (dev << 32) | (dev >> 32)
	}
	return layer.Token{Ino: ino, Gen: fs.gen(fd, name, st, ino, hold)}
}

func statx(fd int, st *unix.Statx_t) error {
	return unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT,
		unix.STATX_BASIC_STATS|unix.STATX_BTIME, st)
}

// procPath names the inode that fd holds, for calls that take no fd.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// errno turns a host error into an Errno.
func errno(err error) layer.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}

// validName refuses names the kernel would never send but a buggy or
// hostile layer above might: they could escape the directory.
func validName(name string) layer.Errno {
	if name == "" || name == "." || name == ".." {
		return syscall.EINVAL
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return syscall.EINVAL
		}
	}
	if len(name) > 255 {
		return syscall.ENAMETOOLONG
	}
	return 0
}

func (n *node) Token() layer.Token { return n.token }

func (n *node) Forget() {
	n.forget()
	n.fs.minted.release(n.token)
}

// child opens name beneath the directory dirfd as a new node and stats it.
func (fs *FS) child(dirfd int, name string, out *layer.Attr) (*node, layer.Errno) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errno(err)
	}
	return fs.adopt(fd, out)
}

// adopt makes a node of an O_PATH descriptor.
func (fs *FS) adopt(fd int, out *layer.Attr) (*node, layer.Errno) {
	var st unix.Statx_t
	if err := statx(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errno(err)
	}
	out.FromStatx(&st)
	// The node first: it holds a minted generation (gen.go) that the
	// watch's token of it must be.
	n := fs.newNode(fd, &st)
	fs.watchDir(fd, &st) // before a view can cache anything in it
	fs.fds.add(n)
	return n, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	fd, e := n.useDir(name)
	if e != 0 {
		return nil, e
	}
	defer n.done()
	// Only the step the caller takes runs as the caller; making the node
	// of it is ours (adopt's stats, handles and watches).
	var cfd int
	err := n.fs.checked(ctx, func() (err error) {
		cfd, err = unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, errno(err)
	}
	c, e := n.fs.adopt(cfd, out)
	if e != 0 {
		return nil, e
	}
	return c, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error { return unix.Mkdirat(dirfd, name, newMode(ctx, dirfd, mode)) })
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error { return unix.Mknodat(dirfd, name, newMode(ctx, dirfd, mode), int(dev)) })
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error { return unix.Symlinkat(string(target), dirfd, name) })
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	// linkat with AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc form
	// works for everyone and names the same inode.
	tfd, e := t.use()
	if e != 0 {
		return nil, e
	}
	defer t.done()
	defer n.fs.raise(ctx, layer.Attrs, t.token, "") // its link count
	return n.make(ctx, name, out, func(dirfd int) error {
		return unix.Linkat(unix.AT_FDCWD, procPath(tfd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	})
}

// make runs mk as the caller and returns the node it made.
func (n *node) make(ctx context.Context, name string, out *layer.Attr, mk func(dirfd int) error) (layer.Node, layer.Errno) {
	fd, e := n.useDir(name)
	if e != 0 {
		return nil, e
	}
	defer n.done()
	if err := n.fs.asCaller(ctx, func() error { return mk(fd) }); err != nil {
		return nil, errno(err)
	}
	n.fs.raise(ctx, layer.Entries, n.token, name)
	c, e := n.fs.child(fd, name, out)
	if e != 0 {
		return nil, e
	}
	return c, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	dirfd, e := n.useDir(name)
	if e != 0 {
		return nil, nil, e
	}
	defer n.done()
	// Non-blocking, so that a fifo of that name (O_CREAT without O_EXCL
	// opens what is there) cannot hang the request: it is refused below.
	var fd int
	err := n.fs.asCaller(ctx, func() (err error) {
		fd, err = unix.Openat(dirfd, name, int(flags)|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, newMode(ctx, dirfd, mode))
		return err
	})
	if err != nil {
		return nil, nil, errno(err)
	}
	if e := regularFd(fd, flags); e != 0 {
		unix.Close(fd)
		return nil, nil, e
	}
	n.fs.raise(ctx, layer.Entries, n.token, name)
	// The node must hold the inode we opened, not whatever the name
	// points to by now.
	pfd, err := unix.Open(procPath(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, errno(err)
	}
	c, e := n.fs.adopt(pfd, out)
	if e != 0 {
		unix.Close(fd)
		return nil, nil, e
	}
	return c, c.newFile(fd), 0
}

// regularFd checks that Create opened a regular file (a name of another
// kind of file gives EEXIST: a file system above serves data of regular
// files only) and takes O_NONBLOCK off again unless flags asked for it.
func regularFd(fd int, flags uint32) layer.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return syscall.EEXIST
	}
	if flags&unix.O_NONBLOCK == 0 {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
		}
		if err != nil {
			return errno(err)
		}
	}
	return 0
}

func (n *node) Unlink(ctx context.Context, name string) layer.Errno {
	return n.remove(ctx, name, 0)
}

func (n *node) Rmdir(ctx context.Context, name string) layer.Errno {
	return n.remove(ctx, name, unix.AT_REMOVEDIR)
}

// remove unlinks name with unlinkat's flags.
func (n *node) remove(ctx context.Context, name string, flags int) layer.Errno {
	fd, e := n.useDir(name)
	if e != 0 {
		return e
	}
	defer n.done()
	if flags == 0 {
		n.fs.raiseGone(ctx, fd, name) // a file's other links change
	}
	if err := n.fs.checked(ctx, func() error { return unix.Unlinkat(fd, name, flags) }); err != nil {
		return errno(err)
	}
	n.fs.raise(ctx, layer.Entries, n.token, name)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	d, ok := newDir.(*node)
	if !ok {
		return syscall.EXDEV
	}
	fd, e := n.useDir(name)
	if e != 0 {
		return e
	}
	defer n.done()
	dfd, e := d.useDir(newName)
	if e != 0 {
		return e
	}
	defer d.done()
	n.fs.raiseGone(ctx, dfd, newName)
	if err := n.fs.checked(ctx, func() error { return unix.Renameat2(fd, name, dfd, newName, uint(flags)) }); err != nil {
		return errno(err)
	}
	n.fs.raiseGone(ctx, dfd, newName) // the moved file's ctime
	n.fs.raise(ctx, layer.Entries, n.token, name)
	n.fs.raise(ctx, layer.Entries, d.token, newName)
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, layer.Errno) {
	fd, e := n.use()
	if e != 0 {
		return nil, e
	}
	defer n.done()
	var target []byte
	err := n.fs.checked(ctx, func() error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			k, err := unix.Readlinkat(fd, "", buf)
			if err != nil {
				return err
			}
			if k < size {
				target = buf[:k]
				return nil
			}
		}
	})
	return target, errno(err)
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	// O_NOFOLLOW would refuse the /proc link itself; the node is never a
	// symlink here because the kernel does not open symlinks.
	flags &^= unix.O_CREAT | unix.O_EXCL | unix.O_NOCTTY | unix.O_NOFOLLOW
	nfd, e := n.use()
	if e != 0 {
		return nil, e
	}
	defer n.done()
	var fd int
	open := func() (err error) {
		fd, err = unix.Open(procPath(nfd), int(flags)|unix.O_CLOEXEC, 0)
		return err
	}
	err := n.fs.checked(ctx, open)
	if err == unix.EPERM && flags&unix.O_NOATIME != 0 && !checking(ctx) {
		// O_NOATIME is for the owner; it is a wish, not a need. (Under
		// Check the caller sees EPERM, as a local program would.)
		flags &^= unix.O_NOATIME
		err = open()
	}
	if err != nil {
		return nil, errno(err)
	}
	return n.newFile(fd), 0
}

func (n *node) Statfs(ctx context.Context, out *layer.Statfs) layer.Errno {
	fd, e := n.use()
	if e != 0 {
		return e
	}
	defer n.done()
	var st unix.Statfs_t
	if err := n.fs.checked(ctx, func() error { return unix.Fstatfs(fd, &st) }); err != nil {
		return errno(err)
	}
	*out = layer.Statfs{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), Frsize: uint32(st.Frsize), NameLen: uint32(st.Namelen),
	}
	return 0
}

// useDir checks that name is a single component and returns the node's
// descriptor to act on it; done must follow.
func (n *node) useDir(name string) (int, layer.Errno) {
	if e := validName(name); e != 0 {
		return -1, e
	}
	return n.use()
}

// withPath runs fn as the caller on the /proc path of the node's
// descriptor.
func (n *node) withPath(ctx context.Context, fn func(path string) error) layer.Errno {
	fd, e := n.use()
	if e != 0 {
		return e
	}
	defer n.done()
	return errno(n.fs.checked(ctx, func() error { return fn(procPath(fd)) }))
}

func (n *node) Getxattr(ctx context.Context, name string, dest []byte) (k int, e layer.Errno) {
	e = n.withPath(ctx, func(p string) (err error) {
		k, err = unix.Getxattr(p, name, dest)
		return err
	})
	return k, e
}

func (n *node) Setxattr(ctx context.Context, name string, value []byte, flags uint32) layer.Errno {
	defer n.fs.raise(ctx, layer.Attrs, n.token, "")
	return n.withPath(ctx, func(p string) error { return unix.Setxattr(p, name, value, int(flags)) })
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (k int, e layer.Errno) {
	e = n.withPath(ctx, func(p string) (err error) {
		k, err = unix.Listxattr(p, dest)
		return err
	})
	return k, e
}

func (n *node) Removexattr(ctx context.Context, name string) layer.Errno {
	defer n.fs.raise(ctx, layer.Attrs, n.token, "")
	return n.withPath(ctx, func(p string) error { return unix.Removexattr(p, name) })
}

// A local directory is the bottom of stacks whose lower has no scheme.
func init() { stack.RegisterBackend(stack.Backend{Scheme: "", Open: New}) }
