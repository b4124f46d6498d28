package fuseview

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

// With remote locking on, the kernel keeps no locks of its own and counts
// on the server to drop a process's POSIX locks when the process closes any
// descriptor of the file; FLUSH names that process's lock owner. go-fuse's
// node API does not pass it on, so rawFS notes it under the request's
// cancel channel, which is unique to the request while it runs, and the
// handle's Flush reads it back from its context.
type rawFS struct {
	fuse.RawFileSystem
	flushOwners sync.Map // <-chan struct{} -> uint64
}

func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	r.flushOwners.Store(cancel, in.LockOwner)
	defer r.flushOwners.Delete(cancel)
	return r.RawFileSystem.Flush(cancel, in)
}

func (r *rawFS) flushOwner(ctx context.Context) uint64 {
	if fc, ok := ctx.(*fuse.Context); ok {
		if o, ok := r.flushOwners.Load(fc.Cancel); ok {
			return o.(uint64)
		}
	}
	return 0
}

func toLock(in *fuse.FileLock, flags uint32) *layer.Lock {
	return &layer.Lock{Start: in.Start, End: in.End, Type: in.Typ, Pid: in.Pid, Flock: flags&fuse.FUSE_LK_FLOCK != 0}
}

func (h *handle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	l := toLock(lk, flags)
	if e := h.h.Getlk(h.v.caller(ctx), owner, l); e != 0 {
		return e
	}
	*out = fuse.FileLock{Start: l.Start, End: l.End, Typ: l.Type, Pid: l.Pid}
	return 0
}

func (h *handle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.h.Setlk(h.v.caller(ctx), owner, toLock(lk, flags), false)
}

func (h *handle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.h.Setlk(h.v.caller(ctx), owner, toLock(lk, flags), true)
}
