// Package layer defines the one interface that every piece of a shale stack
// speaks, above and below: backends (hostfs) implement it, layers consume it
// below and offer it above, frontends (FUSE, 9P) serve it.
//
// The interface is deliberately close to the vnode operations a POSIX file
// system needs, in the shape go-fuse and 9P2000.L share: a Node is a file,
// directory or other object; Open and Create give a Handle for data;
// OpenDir gives a DirStream. Errors are syscall.Errno values so nothing is
// lost between the lower file system and the user; 0 means success.
//
// Every operation takes a context.Context that carries the Caller (uid, gid,
// groups, pid) of the request; see WithCaller and CallerOf.
package layer

import (
	"context"
	"syscall"
)

// Errno is a POSIX error number; 0 is success.
type Errno = syscall.Errno

// OK is the zero Errno.
const OK Errno = 0

// Token identifies a file for coherence. A simply-named layer (one whose
// names and offsets mean the same above and below) returns the token of the
// node beneath; a generally-named layer mints its own. Frontends use Ino as
// the inode number, so two nodes with one token are one file (hard links);
// Gen tells apart files that reuse an inode number after a delete.
type Token struct {
	Ino, Gen uint64
}

// Node is a file system object: a regular file, directory, symlink, device,
// fifo or socket. Methods that make no sense for a node's type return
// ENOTDIR, EISDIR or EINVAL as the kernel would.
//
// A Node stays valid until Forget; renames do not invalidate it.
type Node interface {
	// Token is this node's coherence identity.
	Token() Token

	// Getattr fills out. h is an open handle of this node or nil.
	Getattr(ctx context.Context, h Handle, out *Attr) Errno
	// Setattr changes what in.Valid names and fills out with the result.
	Setattr(ctx context.Context, h Handle, in *SetAttr, out *Attr) Errno

	// Lookup finds the child name (one path component, never "." or "..").
	Lookup(ctx context.Context, name string, out *Attr) (Node, Errno)
	// Mkdir, Mknod, Symlink and Create make a new child owned by the
	// caller; mode holds the permission bits the caller asked for and, for
	// Mknod, the file type. The bottom of the stack masks them with the
	// caller's umask (Caller.Umask) unless the directory has a default ACL,
	// exactly as the lower file system does for a local program.
	Mkdir(ctx context.Context, name string, mode uint32, out *Attr) (Node, Errno)
	Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *Attr) (Node, Errno)
	Symlink(ctx context.Context, target []byte, name string, out *Attr) (Node, Errno)
	Create(ctx context.Context, name string, flags uint32, mode uint32, out *Attr) (Node, Handle, Errno)
	// Link makes name in this directory a new link to target.
	Link(ctx context.Context, target Node, name string, out *Attr) (Node, Errno)
	Unlink(ctx context.Context, name string) Errno
	Rmdir(ctx context.Context, name string) Errno
	// Rename moves name to newName in newDir (a Node of the same layer);
	// flags may hold RENAME_NOREPLACE or RENAME_EXCHANGE.
	Rename(ctx context.Context, name string, newDir Node, newName string, flags uint32) Errno
	Readlink(ctx context.Context) ([]byte, Errno)

	// Open opens a non-directory; flags are open(2) flags.
	Open(ctx context.Context, flags uint32) (Handle, Errno)
	// OpenDir lists a directory.
	OpenDir(ctx context.Context) (DirStream, Errno)

	Statfs(ctx context.Context, out *Statfs) Errno

	// Extended attributes: like getxattr(2) and friends, a zero-length
	// dest asks for the size.
	Getxattr(ctx context.Context, name string, dest []byte) (int, Errno)
	Setxattr(ctx context.Context, name string, value []byte, flags uint32) Errno
	Listxattr(ctx context.Context, dest []byte) (int, Errno)
	Removexattr(ctx context.Context, name string) Errno

	// Forget tells the node no one above refers to it any more; it may
	// release what it holds. No method is called after Forget.
	Forget()
}

// Handle is an open file.
type Handle interface {
	Read(ctx context.Context, dest []byte, off int64) (int, Errno)
	Write(ctx context.Context, data []byte, off int64) (int, Errno)
	// Flush is called on every close(2) of a file descriptor; the
	// closing lock owner loses its POSIX locks on the file, as in fcntl(2).
	Flush(ctx context.Context, owner uint64) Errno
	Fsync(ctx context.Context, datasync bool) Errno
	// Release is the last close; the handle is not used after it. The
	// flock locks taken through it are released.
	Release(ctx context.Context) Errno
	Allocate(ctx context.Context, off, size int64, mode uint32) Errno
	// Lseek serves SEEK_DATA and SEEK_HOLE.
	Lseek(ctx context.Context, off int64, whence int) (int64, Errno)
	// CopyFileRange copies from this handle to dst (a Handle of the same
	// layer) and returns the bytes copied.
	CopyFileRange(ctx context.Context, off int64, dst Handle, dstOff int64, n int, flags uint32) (int, Errno)

	// Advisory locks. owner names the lock owner (a POSIX lock's process
	// or an flock's open file); lk.Flock tells which kind.
	Getlk(ctx context.Context, owner uint64, lk *Lock) Errno
	Setlk(ctx context.Context, owner uint64, lk *Lock, wait bool) Errno
}

// Passthrougher is implemented by handles whose bytes are exactly those of
// a host file; a frontend may then let the kernel do the I/O directly (FUSE
// passthrough). The fd stays owned by the handle.
type Passthrougher interface {
	PassthroughFd() (fd int, ok bool)
}

// WriteShared is implemented by handles that can tell that their file is
// open for writing on another machine too, which keeps no page of this
// one's (a network file the server found write-shared). A mapping shared
// there and here cannot be coherent: stores through one would never reach
// the other, and data would be lost silently. A frontend refuses shared
// mappings of such a handle (fuseview: mmap(MAP_SHARED) fails with
// ENODEV), so that programs that need one (SQLite's WAL index) fail
// loudly instead. Layers that wrap handles pass it on.
type WriteShared interface {
	WriteShared() bool
}

// IsWriteShared tells whether h says its file is write-shared with
// another machine.
func IsWriteShared(h Handle) bool {
	w, ok := h.(WriteShared)
	return ok && w.WriteShared()
}

// DirSeeker is implemented by nodes whose directory streams take, on a
// new stream, any offset an earlier stream gave, whatever changed since:
// the listing goes on after that place (the host's d_off cookies). A
// frontend may then serve a listing through several streams (fuseview's
// READDIRs with no open).
type DirSeeker interface {
	SeeksAnywhere() bool
}

// DirStream reads a directory. Entries carry the offset of the next entry,
// stable under concurrent changes, so a listing can resume with Seek.
type DirStream interface {
	// Next returns the next entry, or ok=false at the end.
	Next(ctx context.Context) (e DirEntry, ok bool, errno Errno)
	// Seek positions the stream so that Next returns the entry that
	// followed the one whose Off was off (0: the start).
	Seek(ctx context.Context, off uint64) Errno
	Fsync(ctx context.Context, datasync bool) Errno
	Close()
}

// DirEntry is one directory entry.
type DirEntry struct {
	Name string
	Ino  uint64 // informational; frontends use Lookup's Token
	Type uint32 // S_IFMT bits of the mode
	Off  uint64 // offset of the entry after this one
}
