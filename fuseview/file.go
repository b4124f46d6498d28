package fuseview

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

// handle adapts a layer.Handle to go-fuse's file API.
type handle struct {
	h     layer.Handle
	v     *view
	tok   layer.Token
	execs *atomic.Int32 // its inode's count, if opened to run the file
}

// passthroughHandle is a handle whose data the kernel may read and write
// directly in the host file (FUSE passthrough); go-fuse uses it when the
// kernel and our privileges allow, and falls back to Read/Write otherwise.
type passthroughHandle struct {
	handle
	p layer.Passthrougher
}

func (p *passthroughHandle) PassthroughFd() (int, bool) { return p.p.PassthroughFd() }

func (v *view) newHandle(h layer.Handle, tok layer.Token, execs *atomic.Int32) fs.FileHandle {
	if p, ok := h.(layer.Passthrougher); ok && v.opts.Passthrough {
		return &passthroughHandle{handle{h, v, tok, execs}, p}
	}
	return &handle{h, v, tok, execs}
}

// layerHandle returns the layer handle behind a go-fuse file handle, or nil.
func layerHandle(f fs.FileHandle) layer.Handle {
	switch h := f.(type) {
	case *handle:
		return h.h
	case *passthroughHandle:
		return h.h
	}
	return nil
}

// Read counts as in flight (holder.go) until its reply is on its way:
// go-fuse calls Done once it wrote the data, but never for an empty
// reply, which is in flight until Read returns.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	done := h.v.cached.Reading(h.tok)
	k, e := h.h.Read(h.v.caller(ctx), dest, off)
	switch {
	case e != 0:
		done()
		return nil, e
	case k == 0:
		done()
		return fuse.ReadResultData(nil), 0
	}
	return readResult{fuse.ReadResultData(dest[:k]), done}, 0
}

type readResult struct {
	fuse.ReadResult
	done func()
}

func (r readResult) Done() {
	r.ReadResult.Done()
	r.done()
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	defer h.v.cached.Busy(h.tok)()
	k, e := h.h.Write(h.v.caller(ctx), data, off)
	return uint32(k), e
}

func (h *handle) Flush(ctx context.Context) syscall.Errno {
	return h.h.Flush(h.v.caller(ctx), h.v.raw.noted(ctx))
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.h.Fsync(h.v.caller(ctx), flags&fsyncDatasync != 0)
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	if h.execs != nil {
		h.execs.Add(-1)
	}
	return h.h.Release(h.v.caller(ctx))
}

func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	defer h.v.cached.Busy(h.tok)()
	return h.h.Allocate(h.v.caller(ctx), int64(off), int64(size), mode)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	o, e := h.h.Lseek(h.v.caller(ctx), int64(off), int(whence))
	return uint64(o), e
}

// dirHandle adapts a layer.DirStream to go-fuse's directory handle API.
type dirHandle struct {
	d      layer.DirStream
	v      *view
	listed *atomic.Bool // the directory's inode.listed, if the kernel keeps listings
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if d.listed != nil {
		d.listed.Store(true)
	}
	e, ok, errno := d.d.Next(d.v.caller(ctx))
	if errno != 0 || !ok {
		return nil, errno
	}
	return &fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Type, Off: e.Off}, 0
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.d.Seek(d.v.caller(ctx), off)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.d.Fsync(d.v.caller(ctx), flags&fsyncDatasync != 0)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) { d.d.Close() }

// fsyncDatasync is FUSE_FSYNC_FDATASYNC in fuse_fsync_in.fsync_flags.
const fsyncDatasync = 1
