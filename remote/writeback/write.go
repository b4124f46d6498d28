package writeback

import (
	"context"
	"time"

	"github.com/shalefs/shale/layer"
)

// Write keeps a program's write of path, through f as uid, as dirty
// data; false if the file is not to be cached (the caller writes it
// through). size asks the server for the file's size, the first delayed
// write's base.
func (w *Files) Write(ctx context.Context, tok layer.Token, f File, uid uint32, data []byte, off int64, size func(context.Context) (int64, layer.Errno)) (bool, layer.Errno) {
	sf := w.lockedFile(tok)
	var base int64
	var wb *wbFid
	for sf.d == nil && !sf.uncached.Load() {
		// The first delayed write: the size and a fid to write back
		// through come from the server, asked without mu (a handle
		// opened again on a new connection takes it).
		sf.mu.Unlock()
		if wb != nil {
			wb.c.Clunk(wb.fid)
		}
		var e layer.Errno
		if base, e = size(ctx); e != 0 {
			return true, e
		}
		wb = w.openWriteBack(ctx, f, uid)
		sf.mu.Lock()
		if sf.gone {
			// Forgotten while unlocked: start again on its new state.
			sf.mu.Unlock()
			if wb != nil {
				wb.c.Clunk(wb.fid)
			}
			return w.Write(ctx, tok, f, uid, data, off, size)
		}
		if sf.d == nil && !sf.uncached.Load() {
			sf.d = &dirty{size: base, since: time.Now()}
			sf.hasDirty.Store(true)
			sf.wb, wb = wb, nil
		}
	}
	if wb != nil {
		defer wb.c.Clunk(wb.fid)
	}
	if sf.d == nil || sf.uncached.Load() {
		// Write-shared: written through from now on, after what was
		// delayed, which the write must not be overlaid by. (No dirty
		// data: the loop found it write-shared, though an open's answer
		// may have turned caching back on since.)
		var e layer.Errno
		if sf.d != nil {
			e = w.writeBackLocked(ctx, sf, Uncache)
		}
		sf.mu.Unlock()
		return false, e
	}
	added, replaced := sf.d.write(off, data)
	sf.d.mtime = time.Now()
	sf.d.ctime, sf.d.mtimeSet = sf.d.mtime, false
	sf.setFile(f)
	sf.uid = uid
	sf.mu.Unlock()
	w.dirtyBytes.Add(added)
	w.Ctr.Discarded.Add(uint64(replaced))
	if w.dirtyBytes.Load() > w.DirtyMax {
		w.writeBackOldest(ctx)
	}
	return true, 0
}

// openWriteBack opens a fid of f to write its delayed data back through;
// nil if it cannot now (the write-back then walks by name).
func (w *Files) openWriteBack(ctx context.Context, f File, uid uint32) *wbFid {
	c, e := w.Session.Conn(ctx)
	if e != 0 {
		return nil
	}
	fid, iounit, refused, e := f.OpenWriteBack(c, uid)
	if e != 0 || refused {
		return nil
	}
	return &wbFid{c, fid, iounit}
}

// Read reads what path holds for this client: dirty data over what the
// server has, which readClean reads. ok is false if the file has no
// dirty data. A read through a handle without O_NOATIME (noatime false)
// moves a kept atime as relatime would.
func (w *Files) Read(tok layer.Token, dest []byte, off int64, noatime bool, readClean func(dest []byte, off int64) (int, layer.Errno)) (int, bool, layer.Errno) {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return 0, false, 0
	}
	for {
		sf.mu.Lock()
		d := sf.d
		if d == nil {
			sf.mu.Unlock()
			return 0, false, 0
		}
		if off >= d.size {
			sf.mu.Unlock()
			return 0, true, 0
		}
		n := int(min(int64(len(dest)), d.size-off))
		if d.covers(off, int64(n)) {
			d.overlay(dest[:n], off)
			d.accessed(noatime)
			sf.mu.Unlock()
			return n, true, 0
		}
		gen := sf.gen.Load()
		sf.mu.Unlock()
		k, e := readClean(dest[:n], off)
		if e != 0 {
			return 0, true, e
		}
		sf.mu.Lock()
		if sf.gen.Load() != gen || sf.d == nil {
			sf.mu.Unlock()
			continue // a write-back crossed the read: read again
		}
		clear(dest[k:n]) // a hole, or past the server's end
		sf.d.overlay(dest[:n], off)
		sf.d.accessed(noatime)
		sf.mu.Unlock()
		return n, true, 0
	}
}
