package hostfs

import (
	"context"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// file is an open host file.
type file struct {
	fd  int
	tok layer.Token
	fs  *FS

	mu     sync.Mutex
	owners []lockOwner // who took locks through this open file
}

type lockOwner struct {
	owner uint64
	flock bool
}

func (n *node) newFile(fd int) *file { return &file{fd: fd, tok: n.token, fs: n.fs} }

func (f *file) PassthroughFd() (int, bool) { return f.fd, true }

// Handle operations run as the caller too under Check: some take the
// credentials of the moment (a write clears setuid unless CAP_FSETID;
// network file systems check every read and write).

func (f *file) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	var k int
	err := f.fs.checked(ctx, func() (err error) {
		k, err = unix.Pread(f.fd, dest, off)
		return err
	})
	if err != nil {
		return 0, errno(err)
	}
	return k, 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	var k int
	err := f.fs.checked(ctx, func() (err error) {
		k, err = unix.Pwrite(f.fd, data, off)
		return err
	})
	if err != nil {
		return 0, errno(err)
	}
	f.fs.raiseRange(ctx, layer.Data, f.tok, "", off, int64(k))
	return k, 0
}

// Flush closes a duplicate so that a lower file system that reports
// errors on close (NFS, FUSE) reports them to the closing process.
func (f *file) Flush(ctx context.Context, owner uint64) layer.Errno {
	f.fs.st.Locks().Release(f.tok, owner, false)
	// Its locks are gone: Release must not drop ones it takes later
	// through another open file.
	f.mu.Lock()
	f.owners = slices.DeleteFunc(f.owners, func(o lockOwner) bool { return o == lockOwner{owner, false} })
	f.mu.Unlock()
	fd, err := unix.Dup(f.fd)
	if err != nil {
		return errno(err)
	}
	return errno(unix.Close(fd))
}

func (f *file) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return errno(f.fs.checked(ctx, func() error {
		if datasync {
			return unix.Fdatasync(f.fd)
		}
		return unix.Fsync(f.fd)
	}))
}

func (f *file) Release(ctx context.Context) layer.Errno {
	// flock and OFD locks belong to the open file, and the kernel sends
	// no unlock for them when it goes; a POSIX lock owner has flushed its
	// locks before the last close, so releasing every owner is safe.
	f.mu.Lock()
	for _, o := range f.owners {
		f.fs.st.Locks().Release(f.tok, o.owner, o.flock)
	}
	f.mu.Unlock()
	err := unix.Close(f.fd)
	f.fd = -1
	return errno(err)
}

func (f *file) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	if err := f.fs.checked(ctx, func() error { return unix.Fallocate(f.fd, mode, off, size) }); err != nil {
		return errno(err)
	}
	f.fs.raise(ctx, layer.Data, f.tok, "")
	return 0
}

func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, layer.Errno) {
	var o int64
	err := f.fs.checked(ctx, func() (err error) {
		o, err = unix.Seek(f.fd, off, whence)
		return err
	})
	return o, errno(err)
}

func (f *file) CopyFileRange(ctx context.Context, off int64, dst layer.Handle, dstOff int64, n int, flags uint32) (int, layer.Errno) {
	d, ok := dst.(*file)
	if !ok {
		return 0, syscall.EXDEV
	}
	var k int
	err := f.fs.checked(ctx, func() (err error) {
		k, err = unix.CopyFileRange(f.fd, &off, d.fd, &dstOff, n, int(flags))
		return err
	})
	if err != nil {
		return 0, errno(err)
	}
	d.fs.raise(ctx, layer.Data, d.tok, "")
	return k, 0
}

// Locks live in the FS's table, not in the host: the host would see one
// owner, the descriptor shale holds, for every process.
func (f *file) Getlk(ctx context.Context, owner uint64, lk *layer.Lock) layer.Errno {
	f.fs.st.Locks().Get(f.tok, owner, lk)
	return 0
}

func (f *file) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	if !lk.Flock && lk.Type != syscall.F_UNLCK && checking(ctx) {
		// The table never reaches the host, whose fcntl would refuse a
		// POSIX lock the open file's mode does not allow; the kernel does
		// that check for FUSE, nothing for Check frontends.
		if e := f.lockable(lk.Type); e != 0 {
			return e
		}
	}
	e := f.fs.st.Locks().Set(ctx, f.tok, owner, lk, wait)
	if e == 0 && lk.Type != syscall.F_UNLCK {
		o := lockOwner{owner, lk.Flock}
		f.mu.Lock()
		if !slices.Contains(f.owners, o) {
			f.owners = append(f.owners, o)
		}
		f.mu.Unlock()
	}
	return e
}

// lockable tells whether the open file's access mode allows a POSIX lock
// of type typ, as fcntl(2) requires: reading for F_RDLCK, writing for
// F_WRLCK.
func (f *file) lockable(typ uint32) layer.Errno {
	fl, err := unix.FcntlInt(uintptr(f.fd), unix.F_GETFL, 0)
	if err != nil {
		return errno(err)
	}
	acc := fl & unix.O_ACCMODE
	if typ == syscall.F_RDLCK && acc == unix.O_WRONLY || typ == syscall.F_WRLCK && acc == unix.O_RDONLY {
		return syscall.EBADF
	}
	return 0
}
