package fuseview

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS passes on what go-fuse's node API drops from a request:
//
//   - FLUSH's lock owner. With remote locking on, the kernel keeps no locks
//     of its own and counts on the server to drop a process's POSIX locks
//     when the process closes any descriptor of the file.
//   - The umask of CREATE, MKDIR and MKNOD. With POSIX ACLs on and
//     DONT_MASK, the kernel sends the mode unmasked, so that the bottom of
//     the stack can apply the umask or the directory's default ACL, as the
//     lower file system would for a local program.
//
// It notes the value under the request's cancel channel, which is unique
// to the request while it runs, and the node reads it back from its
// context. It counts the requests at work that may give the kernel an
// inode (forget.go, view.hold): LOOKUP, READDIRPLUS and LINK, which may
// give one go-fuse already knows, and the creating ones.
//
// It also serves directories the kernel opened without OPENDIR
// (opendir.go).
type rawFS struct {
	fuse.RawFileSystem
	notes  sync.Map // <-chan struct{} -> uint64
	makers *makers

	noOpendir bool // answer OPENDIR with ENOSYS
	cursors   dirCursors
}

func (r *rawFS) note(cancel <-chan struct{}, v uint64) func() {
	r.notes.Store(cancel, v)
	return func() { r.notes.Delete(cancel) }
}

// noted returns what was noted for the request of ctx, or 0.
func (r *rawFS) noted(ctx context.Context) uint64 {
	if fc, ok := ctx.(*fuse.Context); ok {
		if v, ok := r.notes.Load(fc.Cancel); ok {
			return v.(uint64)
		}
	}
	return 0
}

func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	defer r.note(cancel, in.LockOwner)()
	return r.RawFileSystem.Flush(cancel, in)
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.makers.start()()
	defer r.note(cancel, uint64(in.Umask))()
	return r.RawFileSystem.Create(cancel, in, name, out)
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.makers.start()()
	defer r.note(cancel, uint64(in.Umask))()
	return r.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.makers.start()()
	defer r.note(cancel, uint64(in.Umask))()
	return r.RawFileSystem.Mknod(cancel, in, name, out)
}

func (r *rawFS) Symlink(cancel <-chan struct{}, header *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	defer r.makers.start()()
	return r.RawFileSystem.Symlink(cancel, header, target, name, out)
}

func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer r.makers.start()()
	return r.RawFileSystem.Lookup(cancel, h, name, out)
}

func (r *rawFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.makers.start()()
	return r.RawFileSystem.Link(cancel, in, name, out)
}
