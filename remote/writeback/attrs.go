package writeback

import (
	"context"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/session"
)

// Gen is the count of write-backs and discards of the files numbered
// path, taken before asking the server for attributes of path, whose
// token is not known yet: see OverlayAttrSince.
func (w *Files) Gen(path uint64) uint64 {
	// On every stat and lookup: no copy of the list.
	w.smu.Lock()
	defer w.smu.Unlock()
	var g uint64
	for _, sf := range w.sfiles[path] {
		g += sf.gen.Load()
	}
	return g
}

// OverlayAttrSince is OverlayAttr for attributes the server gave after
// Gen returned gen; false if a write-back ran meanwhile: they may be
// from before it, with the dirty data it sent no longer there to show,
// so they must be asked again.
func (w *Files) OverlayAttrSince(tok layer.Token, a *layer.Attr, gen uint64) bool {
	return w.overlaySince(tok, a, func() bool { return w.Gen(tok.Ino) == gen })
}

// GenAll is the count of write-backs and discards of every file, taken
// before asking the server for attributes of a file not known yet at
// all (a Tgetattr sent with the walk that finds it): see
// OverlayAttrSinceAll.
func (w *Files) GenAll() uint64 { return w.settles.Load() }

// OverlayAttrSinceAll is OverlayAttrSince for a count GenAll returned:
// false if any file's write-back ran meanwhile.
func (w *Files) OverlayAttrSinceAll(tok layer.Token, a *layer.Attr, all uint64) bool {
	return w.overlaySince(tok, a, func() bool { return w.settles.Load() == all })
}

func (w *Files) overlaySince(tok layer.Token, a *layer.Attr, same func() bool) bool {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return same() // settled counts before it clears hasDirty
	}
	// Compared under mu: a write-back holds it until it settles, and
	// the attributes, asked while it ran, predate it (the soak: a link's
	// reply, after a stall, gave the kernel the server's size 0 of a
	// file whose data was landing, and the next append went to 0).
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if !same() {
		return false
	}
	sf.overlayLocked(a)
	return true
}

// OverlayAttr shows path's dirty data in its attributes: the size and
// times the client knows better than the server.
func (w *Files) OverlayAttr(tok layer.Token, a *layer.Attr) {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.overlayLocked(a)
}

func (sf *sfile) overlayLocked(a *layer.Attr) {
	if d := sf.d; d != nil {
		a.Size = uint64(d.size)
		a.Blocks += uint64(d.bytes()+511) / 512
		if d.mtimeSet || d.mtime.After(a.Mtime) {
			a.Mtime = d.mtime
		}
		if !d.atime.IsZero() {
			a.Atime = d.atime
		}
		if d.ctime.After(a.Ctime) {
			a.Ctime = d.ctime
		}
	}
}

// timeBits are the settings of times.
const timeBits = layer.SetAtime | layer.SetAtimeNow | layer.SetMtime | layer.SetMtimeNow

// KeepTimes keeps a setting of times alone (utimes) of a file with
// delayed writes, made by who, as of now: they go to the server after
// the data, and stat shows them meanwhile. It reports whether it kept
// them. The caller has made sure that the server will take them from
// who (the file's owner). Sent at once, they would write the data back
// first: a build that finds its output up to date touches it, and would
// write back the output it wrote a moment before.
func (w *Files) KeepTimes(tok layer.Token, who uint32, in *layer.SetAttr, now time.Time) bool {
	if in.Valid&timeBits == 0 || in.Valid&^timeBits != 0 {
		return false
	}
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() || sf.followed.Load() {
		// (Another client follows the file: its stat must show the
		// times once the setting returns, as the server's.)
		return false
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	d := sf.d
	if d == nil || d.timesSet && d.timesBy != who {
		return false
	}
	switch {
	case in.Valid&layer.SetAtimeNow != 0:
		d.atime = now
	case in.Valid&layer.SetAtime != 0:
		d.atime = in.Atime
	}
	switch {
	case in.Valid&layer.SetMtimeNow != 0:
		d.mtime, d.mtimeSet = now, true
	case in.Valid&layer.SetMtime != 0:
		d.mtime, d.mtimeSet = in.Mtime, true
	}
	d.ctime, d.timesSet, d.timesBy = now, true, who
	w.Ctr.TimesKept.Add(1)
	return true
}

// BeforeTrunc is told of an open of tok's file that truncates it: times
// kept with its dirty data (KeepTimes) go to the server first. The
// truncation discards the data they wait for, and moves mtime and ctime
// but not the atime set.
func (w *Files) BeforeTrunc(ctx context.Context, tok layer.Token) layer.Errno {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return 0
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	d := sf.d
	if d == nil || !d.timesSet {
		return 0
	}
	c, e := w.Session.Conn(ctx)
	if e != 0 {
		return e
	}
	if err := sf.f.SetTimes(c, d.timesBy, d.atime, d.mtime); err != nil {
		return session.Errno(err)
	}
	d.timesSet, d.atime, d.mtimeSet = false, time.Time{}, false
	return 0
}

// BeforeSetattr prepares a setattr of path that KeepTimes did not keep:
// a change of times writes the dirty data back first (its write would
// move them again; and a read of what the client holds, which the server
// never sees, would not move atime as relatime wants), and so does any
// change after kept times, which must reach the server first. The
// returned func ends it, after the Tsetattr, told whether the server
// made it: a change of size then cuts the dirty data too. The file stays
// locked against write-backs meanwhile.
func (w *Files) BeforeSetattr(ctx context.Context, tok layer.Token, in *layer.SetAttr) func(made bool) {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return func(bool) {}
	}
	sf.mu.Lock()
	if sf.d != nil && (in.Valid&timeBits != 0 || sf.d.timesSet) {
		w.writeBackLocked(ctx, sf, Setattr)
	}
	return func(made bool) {
		if made && in.Valid&layer.SetSize != 0 {
			w.truncateLocked(sf, int64(in.Size))
		}
		sf.mu.Unlock()
	}
}

// Truncated cuts path's dirty data at size: the server's file was cut
// (an open with O_TRUNC).
func (w *Files) Truncated(tok layer.Token, size int64) {
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.hasDirty.Load() {
		return
	}
	sf.mu.Lock()
	w.truncateLocked(sf, size)
	sf.mu.Unlock()
}

func (w *Files) truncateLocked(sf *sfile, size int64) {
	if sf.d == nil {
		return
	}
	dropped := sf.d.truncate(size)
	w.dirtyBytes.Add(-dropped)
	w.Ctr.Discarded.Add(uint64(dropped))
	if len(sf.d.ext) == 0 {
		// The server's file is what this client sees now.
		w.settled(sf)
	}
}

// Dirty tells whether a file numbered path has delayed writes.
func (w *Files) Dirty(path uint64) bool {
	for _, sf := range w.sfilesOf(path) {
		if sf.hasDirty.Load() {
			return true
		}
	}
	return false
}

// Unlinking is told, before this client removes a name of the file
// numbered path (or renames another file over it), the file's link count
// then (0 if not known). With other names staying, its dirty data is
// written back first, through the name that goes: afterwards no path
// this client knows may reach the file (another client made the other
// name), and the data must not go as a removed file's would.
func (w *Files) Unlinking(ctx context.Context, path uint64, nlink uint32) {
	if nlink < 2 {
		return
	}
	for _, sf := range w.sfilesOf(path) {
		sf.mu.Lock()
		sf.linked = true
		if sf.d != nil {
			w.writeBackLocked(ctx, sf, Unlink)
		}
		sf.mu.Unlock()
	}
}

// Unlinked is told that this client removed a name of the file
// numbered path (or renamed another file over it), which had nlink
// names before (0 if not known). With its last name gone, its dirty
// data never reaches the server: discarded now, or, with a handle that
// may read it back, at its write-back or last close (see File.Removed).
// With other names left it is written back through them.
func (w *Files) Unlinked(path uint64, nlink uint32) {
	if nlink != 1 {
		return // other names remain, or not known to be gone
	}
	for _, sf := range w.sfilesOf(path) {
		if !sf.hasDirty.Load() {
			continue
		}
		sf.mu.Lock()
		sf.linked = false // the last name went
		if !sf.held() {
			w.discardLocked(sf, "its last name was removed")
		}
		sf.mu.Unlock()
	}
}

// discardLocked drops sf's dirty data, counted as discarded: the
// program itself unlinked it. Said at debug level, with why: a loss
// would show here first.
func (w *Files) discardLocked(sf *sfile, why string) {
	if sf.d != nil {
		w.Log.Debug("delayed writes discarded: "+why, "qid", sf.tok.Ino, "bytes", sf.d.bytes())
		w.Ctr.Discarded.Add(uint64(sf.d.bytes()))
		w.dropDirtyLocked(sf)
	}
}

// dropDirtyLocked forgets sf's dirty data, counted by the caller.
func (w *Files) dropDirtyLocked(sf *sfile) {
	if sf.d == nil {
		return
	}
	w.dirtyBytes.Add(-sf.d.bytes())
	w.settled(sf)
	if wb := sf.wb; wb != nil {
		sf.wb = nil
		wb.c.Clunk(wb.fid)
	}
}
