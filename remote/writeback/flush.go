package writeback

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// WriteBack writes path's dirty data back, for why.
func (w *Files) WriteBack(ctx context.Context, tok layer.Token, why Reason) layer.Errno {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return 0
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return w.writeBackLocked(ctx, sf, why)
}

// writeBackLocked writes sf's dirty data to the server, through a
// handle of the file open for writing, or a fid opened for the purpose
// (journal.WriteBack: the server counts no open of a program). Data this
// client unlinked or replaced the file of goes, as it would locally; data
// that cannot be written back otherwise (another client wrote, removed
// or renamed the file, the server refused) is kept in a conflict copy
// (lost.go). A lost connection keeps it and is waited for; the
// reconnection reclaims the data first.
func (w *Files) writeBackLocked(ctx context.Context, sf *sfile, why Reason) layer.Errno {
	var e layer.Errno
	w.Session.UntilNotLost(ctx, func() (lost bool) {
		e, lost = w.writeBackOnce(ctx, sf, why)
		return lost
	})
	return e
}

func (w *Files) writeBackOnce(ctx context.Context, sf *sfile, why Reason) (layer.Errno, bool) {
	d := sf.d
	if d == nil {
		return 0, false
	}
	if sf.refused.Swap(false) {
		return w.lostLocked(sf, "the server restarted and another client wrote the file before this one reclaimed its writes"), false
	}
	c, e := w.Session.Conn(ctx)
	if e != 0 {
		return e, false // none came within the timeout: kept for later
	}
	fid, iounit, done, refused, e := w.writeBackFid(c, sf)
	switch {
	case refused:
		return w.lostLocked(sf, "another client wrote the file while this one could not reach the server"), false
	case e == syscall.ESTALE || e == syscall.ENOENT:
		// No fid reaches the file, nor any name this client knows.
		switch {
		case w.nameChanging(sf.tok.Ino):
			return syscall.EIO, false // kept: this client's rename or unlink of it is landing (NameChange)
		case !sf.f.Removed():
			return w.lostLocked(sf, "another client removed or renamed the file", "walk", e.Error(), "reason", ReasonNames[why]), false
		case sf.linked:
			return w.lostLocked(sf, "no name this client knows reaches the file, which has another (a hard link made elsewhere)", "reason", ReasonNames[why]), false
		case sf.held():
			return 0, false // a handle may read it back yet: kept until the last closes (Released)
		}
		// This client removed its last name (or renamed another file
		// over it): as a local file's, its data goes.
		w.discardLocked(sf, "its last name was removed here, and no handle reads it")
		return 0, false
	case e != 0:
		// EIO: the connection went; EINTR: the server cut the request
		// short (it is ending): both are tried again.
		return e, e == syscall.EIO || e == syscall.EINTR
	}
	defer done()
	for _, x := range d.ext {
		k, err := c.WriteAt(fid, iounit, x.data, x.off)
		w.Ctr.WriteServerBytes.Add(uint64(k))
		if err != nil {
			if errors.Is(err, session.ErrLost) || errors.Is(err, syscall.EINTR) {
				return syscall.EIO, true // kept, to write again: the connection went, or the server is ending
			}
			return w.lostLocked(sf, "the server refused the write: "+session.Errno(err).Error()), false
		}
	}
	// The file's modification time is when the program wrote, not when
	// the data reached the server: make and its kind compare them. Only
	// the owner may set it; others' write-backs leave the server's.
	// Times a program set go as that program's user (KeepTimes).
	if d.timesSet {
		if err := sf.f.SetTimes(c, d.timesBy, d.atime, d.mtime); err != nil {
			if errors.Is(err, session.ErrLost) || errors.Is(err, syscall.EINTR) {
				return syscall.EIO, true // kept, to write again
			}
			w.Log.Warn("9p: the server refused the times a program set while its writes were delayed: the file has the server's", "qid", sf.tok.Ino, "err", session.Errno(err))
		}
	} else {
		c.SetMtime(fid, d.mtime)
	}
	n := d.bytes()
	w.dirtyBytes.Add(-n)
	for _, x := range d.ext {
		w.Cache.DropData(sf.tok.Ino, uint64(x.off), uint64(len(x.data)))
	}
	w.Cache.DropAttrs(sf.tok.Ino)
	w.settled(sf)
	w.Ctr.WriteBacks[why].Add(1)
	if why != Recall && why != Uncache {
		w.cleanLocked(sf) // a Recall's answer says as much
	}
	return 0, false
}

// cleanLocked tells the server, if no handle of this client can write
// the file, that the client holds nothing dirty of it (a Clean of its
// own, with the version of its last open for writing), so that the next
// open elsewhere needs no recall. Sent in the background.
func (w *Files) cleanLocked(sf *sfile) {
	if sf.d != nil || w.Send == nil {
		return
	}
	sf.vmu.Lock()
	known, version := sf.known, sf.version
	sf.vmu.Unlock()
	idle := !sf.writing()
	if !idle || !known {
		return
	}
	r := journal.Record{Kind: journal.Clean, Qid: p9wire.Qid{Path: sf.tok.Ino, Vers: version}}
	go func() {
		w.Send(r)
		w.Ctr.Cleans.Add(1)
	}()
}

// writeBackFid is a fid to write sf's file through. refused is the
// server's ESTALE to the open itself (not to the walk: a file removed).
func (w *Files) writeBackFid(c *session.Conn, sf *sfile) (fid, iounit uint32, done func(), refused bool, e layer.Errno) {
	if wb := sf.wb; wb != nil {
		sf.wb = nil
		if wb.c == c {
			return wb.fid, wb.iounit, func() { c.Clunk(wb.fid) }, false, 0
		}
	}
	// A handle open on this connection; not one to open again, which
	// would count as a program's open (and take sf.mu).
	sf.vmu.Lock()
	var writers []Writer
	for h, write := range sf.handles {
		if write {
			writers = append(writers, h)
		}
	}
	sf.vmu.Unlock()
	for _, h := range writers {
		if fid, iounit, ok := h.FidOn(c); ok {
			return fid, iounit, noop, false, 0
		}
	}
	if fid, iounit, refused, e = sf.f.OpenWriteBack(c, sf.uid); e != 0 {
		return 0, 0, noop, refused, e
	}
	return fid, iounit, func() { c.Clunk(fid) }, false, 0
}

// writeBackOldest writes back the files dirty longest until at most
// DirtyMax is dirty: memory is short. Each file is tried once: one that
// cannot go back now (removed, still open) is left.
func (w *Files) writeBackOldest(ctx context.Context) {
	tried := map[*sfile]bool{}
	for w.dirtyBytes.Load() > w.DirtyMax && ctx.Err() == nil {
		var oldest *sfile
		var at time.Time
		for _, sf := range w.dirtyFiles() {
			sf.mu.Lock()
			if sf.d != nil && !tried[sf] && (oldest == nil || sf.d.since.Before(at)) {
				oldest, at = sf, sf.d.since
			}
			sf.mu.Unlock()
		}
		if oldest == nil {
			return
		}
		tried[oldest] = true
		if w.WriteBack(ctx, oldest.tok, Memory) != 0 {
			return
		}
	}
}

// flusher writes back what has been dirty for the write delay, until
// the client closes.
func (w *Files) flusher() {
	tick := min(w.Delay/4, time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
		}
		now := time.Now()
		w.sample(now)
		for _, sf := range w.dirtyFiles() {
			sf.mu.Lock()
			if sf.d != nil && now.Sub(sf.d.since) >= w.Delay {
				w.writeBackLocked(context.Background(), sf, Age)
			}
			sf.mu.Unlock()
		}
	}
}

// WriteBackAll writes every dirty file back, for why.
func (w *Files) WriteBackAll(ctx context.Context, why Reason) {
	for _, sf := range w.dirtyFiles() {
		w.WriteBack(ctx, sf.tok, why)
	}
}

// Leaving is the end of the client, its dirty data written back: what
// could not be is said, a line a file; with nothing left, the server is
// told (a goodbye), so that it waits for no recall of ours.
func (w *Files) Leaving() {
	left := w.dirtyFiles()
	for _, sf := range left {
		sf.mu.Lock()
		if sf.d != nil {
			w.lostLocked(sf, "the client ended and the server could not be reached")
		}
		sf.mu.Unlock()
	}
	if len(left) == 0 && w.Send != nil && w.sprite.Load() {
		w.Send(journal.Record{Kind: journal.Clean, Seq: journal.Goodbye})
	}
}

// Recalled answers a Recall or an Uncache of path (record seq): the
// dirty data goes back to the server, and with uncache the file is
// cached no more; then a Clean tells the server.
func (w *Files) Recalled(path, seq uint64, uncache bool) {
	ctx := context.Background()
	why := Recall
	if uncache {
		why = Uncache
		w.Ctr.Uncaches.Add(1)
	} else {
		w.Ctr.Recalls.Add(1)
	}
	sfs := w.sfilesOf(path)
	if g := w.GenOf(path); len(sfs) == 0 && uncache && g != 0 {
		// Remembered for the open in flight, whose answer it crossed.
		sfs = append(sfs, w.sfileOf(layer.Token{Ino: path, Gen: g}, true))
	}
	for _, sf := range sfs {
		sf.mu.Lock()
		if sf.gone {
			sf.mu.Unlock()
			continue // idle, forgotten meanwhile: nothing to write back
		}
		drop := uncache && !sf.uncached.Load()
		if uncache {
			sf.vmu.Lock()
			sf.uncaches++
			sf.uncached.Store(true)
			sf.vmu.Unlock()
		}
		w.writeBackLocked(ctx, sf, why)
		sf.mu.Unlock()
		if drop {
			// Not under mu: the kernel's invalidation waits for reads in
			// flight, which may want it.
			w.Cache.DropData(path, 0, 0)
			w.Notice(layer.Event{Kind: layer.Data, Token: sf.tok})
		}
	}
	w.Send(journal.Record{Kind: journal.Clean, Seq: seq, Qid: p9wire.Qid{Path: path}})
}

// Reclaim tells a Sprite server, on a new connection and before
// anything else, through fid of its journal, which files this client
// holds dirty data of (one Dirty a write, so that a refusal names its
// file), then says hello.
func (w *Files) Reclaim(c *session.Conn, fid uint32) error {
	for _, sf := range w.dirtyFiles() {
		if !sf.named() {
			continue // removed here: nothing to write back (its number may be another's now)
		}
		b := journal.Append(nil, &journal.Record{Kind: journal.Dirty, Qid: p9wire.Qid{Path: sf.tok.Ino}})
		if _, err := c.WriteAt(fid, 0, b, 0); err != nil {
			if errors.Is(err, session.ErrLost) {
				return err
			}
			sf.refused.Store(true) // told at its write-back, which follows at once
			w.Ctr.ReclaimsRefused.Add(1)
		}
	}
	b := journal.Append(nil, &journal.Record{Kind: journal.Clean, Qid: p9wire.Qid{Vers: journal.Follows | journal.Delegates}})
	_, err := c.WriteAt(fid, 0, b, 0)
	return err
}

func noop() {}
