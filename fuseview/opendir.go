package fuseview

import (
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// No OPENDIR. A coherent view answers the kernel's first OPENDIR with
// ENOSYS, and the kernel then opens directories without asking
// (FUSE_NO_OPENDIR_SUPPORT): no OPENDIR and no RELEASEDIR per opendir(3),
// and it keeps the listing as if we had said FOPEN_CACHE_DIR, dropped, as
// before, by the view's notifications (holder.go) and by changing
// (node.go). Its READDIRs then come with no handle, which go-fuse's node
// API cannot serve: the view opens a handle of its own through the
// bridge, which seeks it to the READDIR's offset, and keeps it for the
// READDIR that continues the listing, up to its end.
//
// Only with default_permissions (AllowOther): the kernel then checks the
// directory's permissions at open, where OPENDIR would have.

// dirCursors are the handles the view opened for READDIRs with none,
// by node ID: one per directory, taken out while a READDIR uses it.
type dirCursors struct {
	mu sync.Mutex
	fh map[uint64]uint64
}

// maxCursors bounds the listings left unfinished (ls | head), whose
// handles would otherwise stay open until the kernel forgets the
// directory.
const maxCursors = 64

func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if r.noOpendir {
		return fuse.ENOSYS
	}
	return r.RawFileSystem.OpenDir(cancel, in, out)
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Fh != 0 {
		return r.RawFileSystem.ReadDir(cancel, in, out)
	}
	return r.readDirCursor(cancel, in, out, r.RawFileSystem.ReadDir)
}

// ReadDirPlus is counted as LOOKUP is (forget.go): its entries may give
// the kernel inodes go-fuse knows.
func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	defer r.makers.start()()
	if in.Fh != 0 {
		return r.RawFileSystem.ReadDirPlus(cancel, in, out)
	}
	return r.readDirCursor(cancel, in, out, r.RawFileSystem.ReadDirPlus)
}

// readDirCursor serves a READDIR(PLUS) that came with no handle by read,
// through the directory's cursor, kept if the listing goes on.
func (r *rawFS) readDirCursor(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList,
	read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	fh, st := r.takeCursor(cancel, in.InHeader)
	if st != fuse.OK {
		return st
	}
	with := *in
	with.Fh = fh
	st = read(cancel, &with, out)
	if st == fuse.OK && len(out.Bytes()) > 0 {
		r.putCursor(in.NodeId, fh)
	} else {
		r.release(in.NodeId, fh)
	}
	return st
}

func (r *rawFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if in.Fh != 0 {
		return r.RawFileSystem.FsyncDir(cancel, in)
	}
	fh, st := r.takeCursor(cancel, in.InHeader)
	if st != fuse.OK {
		return st
	}
	with := *in
	with.Fh = fh
	st = r.RawFileSystem.FsyncDir(cancel, &with)
	r.putCursor(in.NodeId, fh)
	return st
}

// takeCursor returns the directory's cursor, or a new handle.
func (r *rawFS) takeCursor(cancel <-chan struct{}, h fuse.InHeader) (uint64, fuse.Status) {
	r.cursors.mu.Lock()
	fh, ok := r.cursors.fh[h.NodeId]
	delete(r.cursors.fh, h.NodeId)
	r.cursors.mu.Unlock()
	if ok {
		return fh, fuse.OK
	}
	var out fuse.OpenOut
	st := r.RawFileSystem.OpenDir(cancel, &fuse.OpenIn{InHeader: h, Flags: syscall.O_RDONLY | syscall.O_DIRECTORY}, &out)
	return out.Fh, st
}

// putCursor keeps fh as the directory's cursor, unless another READDIR
// kept one meanwhile.
func (r *rawFS) putCursor(node, fh uint64) {
	r.cursors.mu.Lock()
	_, taken := r.cursors.fh[node]
	var evict, evictFh uint64
	if !taken {
		if r.cursors.fh == nil {
			r.cursors.fh = make(map[uint64]uint64)
		}
		if len(r.cursors.fh) >= maxCursors {
			for evict, evictFh = range r.cursors.fh {
				break
			}
			delete(r.cursors.fh, evict)
		}
		r.cursors.fh[node] = fh
	}
	r.cursors.mu.Unlock()
	if taken {
		r.release(node, fh)
	}
	if evictFh != 0 {
		r.release(evict, evictFh)
	}
}

func (r *rawFS) release(node, fh uint64) {
	r.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: node}, Fh: fh})
}

// Forget closes the directory's cursor: its handle would keep the node.
func (r *rawFS) Forget(node, nlookup uint64) {
	r.cursors.mu.Lock()
	fh, ok := r.cursors.fh[node]
	delete(r.cursors.fh, node)
	r.cursors.mu.Unlock()
	if ok {
		r.release(node, fh)
	}
	r.RawFileSystem.Forget(node, nlookup)
}

// OnUnmount closes the cursors left: the kernel forgets nothing when
// the mount goes.
func (r *rawFS) OnUnmount() {
	r.cursors.mu.Lock()
	left := r.cursors.fh
	r.cursors.fh = nil
	r.cursors.mu.Unlock()
	for node, fh := range left {
		r.release(node, fh)
	}
	r.RawFileSystem.OnUnmount()
}
