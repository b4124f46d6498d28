package hostfs

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/lock"
)

// file is an open host file.
type file struct {
	fd  int
	tok layer.Token
	fs  *FS

	locks lock.Open // who took locks through this open file
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
	f.locks.Flush(f.fs.st.Locks(), f.tok, owner)
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
	f.locks.Release(f.fs.st.Locks(), f.tok)
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
	return f.locks.Set(ctx, f.fs.st.Locks(), f.tok, owner, lk, wait)
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
