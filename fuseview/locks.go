package fuseview

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

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
