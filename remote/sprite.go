package remote

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// Sprite's consistency rules (seeds/001, docs/sprite.md), with a server
// that follows them (its journal says so: journal.Sprite):
//
//   - every open is a Tlopen, answered with the file's version: an open
//     that finds another version than the one it cached drops the
//     file's data and attributes, here and in the kernels above;
//   - writes are delayed: kept here (dirty.go) and written back when
//     they have been dirty for Options.WriteDelay, at fsync, when more
//     than Options.DirtyMax is dirty, when the server recalls them (an
//     open on another client), before a setattr of times, and at
//     unmount. Data overwritten, truncated or unlinked first is never
//     sent;
//   - a file the server says is write-shared (NoCache in an open's
//     version, or an Uncache record) is not cached: reads and writes go
//     to the server, until an open of it is answered without NoCache;
//   - after a reconnection the client reclaims its dirty files (Dirty
//     records) before anything else, then says hello (a Clean of no
//     file), which also tells the server it may send Recall and Uncache.

// Write-back reasons, for the statistics.
const (
	wbAge = iota
	wbFsync
	wbRecall
	wbUncache
	wbMemory
	wbSetattr
	wbUnmount
	wbReset
	nReasons
)

var reasonNames = [nReasons]string{"age", "fsync", "recall", "uncache", "memory", "setattr", "unmount", "reset"}

const (
	defaultWriteDelay = 30 * time.Second
	defaultDirtyMax   = 64 << 20
)

// sfile is what the client keeps of one file under Sprite's rules.
type sfile struct {
	path     uint64
	hasDirty atomic.Bool // d != nil, read without mu (reclaim)
	refused  atomic.Bool // the server refused its reclaim

	mu       sync.Mutex // held across a write-back: writes and reads of dirty data wait
	version  uint32
	known    bool        // version is the server's, as of our last open
	uncached atomic.Bool // write-shared: no caching of its data (read without mu)
	uncaches uint64      // Uncache records applied: one that crossed an open's answer wins
	d        *dirty
	n        *node  // a node of the file, to write back through
	uid      uint32 // who wrote last: the write-back acts as them
	gen      uint64 // write-backs done: a read that crossed one reads again
	writers  map[*handle]bool
	err      atomic.Uint32 // a write-back failed (an Errno): told at the next fsync or close, without mu
	// wb is a fid opened for the write-back when the file became dirty,
	// so that it reaches the file whatever happens to its names.
	wb *wbFid
}

type wbFid struct {
	c           *session.Conn
	fid, iounit uint32
}

// sfileOf is path's state, made if make is true (else nil if none).
func (fs *FS) sfileOf(path uint64, make bool) *sfile {
	fs.smu.Lock()
	defer fs.smu.Unlock()
	sf := fs.sfiles[path]
	if sf == nil && make {
		sf = &sfile{path: path}
		fs.sfiles[path] = sf
	}
	return sf
}

// forgetIdle drops path's state when nothing in it matters any more:
// no dirty data, no writers, no error, no version worth keeping (the
// cache holds nothing of the file).
func (fs *FS) forgetIdle(sf *sfile) {
	if sf.d != nil || len(sf.writers) > 0 || sf.err.Load() != 0 || sf.uncached.Load() || fs.cc.GenOf(sf.path) != 0 {
		return
	}
	fs.smu.Lock()
	if fs.sfiles[sf.path] == sf {
		delete(fs.sfiles, sf.path)
	}
	fs.smu.Unlock()
}

// delaying tells whether writes are delayed: a Sprite server, and a delay.
func (fs *FS) delaying() bool { return fs.sprite.Load() && fs.writeDelay > 0 }

// uncached tells whether path's data must not be cached.
func (fs *FS) uncached(path uint64) bool {
	if !fs.sprite.Load() {
		return false
	}
	sf := fs.sfileOf(path, false)
	if sf == nil {
		return false
	}
	return sf.uncached.Load()
}

// uncachesOf is path's count of Uncache records, taken before an open
// is sent (opened's since).
func (fs *FS) uncachesOf(path uint64) uint64 {
	sf := fs.sfileOf(path, false)
	if sf == nil {
		return 0
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return sf.uncaches
}

// openLock serializes one client's opens of a file.
type openLock struct {
	mu sync.Mutex
	n  int // holders and waiters
}

// openOf holds path's open lock until the returned function runs: from
// before its Tlopen until opened has applied the answer. The server
// answers opens in order, and the answers (the version, whether the file
// is write-shared) must be applied in that order too: an older answer
// applied after a newer one turned caching back on for a file the server
// had just found write-shared, and the writes the client then delayed
// were recalled by nobody.
func (fs *FS) openOf(path uint64) func() {
	if !fs.sprite.Load() {
		return func() {}
	}
	fs.olmu.Lock()
	if fs.olocks == nil {
		fs.olocks = map[uint64]*openLock{}
	}
	l := fs.olocks[path]
	if l == nil {
		l = &openLock{}
		fs.olocks[path] = l
	}
	l.n++
	fs.olmu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		fs.olmu.Lock()
		if l.n--; l.n == 0 {
			delete(fs.olocks, path)
		}
		fs.olmu.Unlock()
	}
}

// opened applies an open's answer: vers is the QID version of Rlopen or
// Rlcreate. A version other than the one cached (the one before it, for
// an open for writing, which bumped it) means another client changed
// the file: what is cached of it goes, here and in the kernels above.
// NoCache in vers turns caching of the file off; its absence turns it
// on, unless an Uncache came since the open was sent (uncachesOf): the
// server sent it after this answer.
func (fs *FS) opened(n *node, h *handle, vers uint32, write bool, since uint64) {
	if !fs.sprite.Load() {
		return
	}
	fs.ctr.opens.Add(1)
	path := n.tok.Ino
	sf := fs.sfileOf(path, true)
	sf.mu.Lock()
	v := vers &^ journal.NoCache
	expect := sf.version
	if write {
		expect = journal.NextVersion(expect)
	}
	stale := sf.known && v != expect
	sf.version, sf.known = v, true
	if vers&journal.NoCache != 0 {
		sf.uncached.Store(true)
		fs.ctr.opensNoCache.Add(1)
	} else if sf.uncaches == since {
		sf.uncached.Store(false)
	}
	if write && h != nil {
		if sf.writers == nil {
			sf.writers = map[*handle]bool{}
		}
		sf.writers[h] = true
	}
	sf.mu.Unlock()
	if stale || sf.uncached.Load() {
		if stale {
			fs.ctr.opensStale.Add(1)
		}
		fs.cc.DropData(path, 0, 0)
		fs.cc.DropAttrs(path)
		fs.notice(layer.Event{Kind: layer.Data, Token: n.tok})
	}
}

// released forgets a handle that could write.
func (fs *FS) released(h *handle) {
	sf := fs.sfileOf(h.n.tok.Ino, false)
	if sf == nil {
		return
	}
	sf.mu.Lock()
	if sf.writers[h] {
		delete(sf.writers, h)
		fs.cleanLocked(sf)
	}
	fs.forgetIdle(sf)
	sf.mu.Unlock()
}

// reopened takes the version a handle's open on a new connection got:
// its own open, not a sign of another client's change.
func (fs *FS) reopened(path uint64, vers uint32, since uint64) {
	if !fs.sprite.Load() {
		return
	}
	sf := fs.sfileOf(path, true)
	sf.mu.Lock()
	sf.version, sf.known = vers&^journal.NoCache, true
	if vers&journal.NoCache != 0 {
		sf.uncached.Store(true)
	} else if sf.uncaches == since {
		sf.uncached.Store(false)
	}
	sf.mu.Unlock()
}

// takeErr returns, once, the error of a failed write-back of path.
func (fs *FS) takeErr(path uint64) layer.Errno {
	sf := fs.sfileOf(path, false)
	if sf == nil {
		return 0
	}
	return layer.Errno(sf.err.Swap(0))
}

// delayWrite keeps a program's write as dirty data; false if the file
// is not to be cached (write through then).
func (h *handle) delayWrite(ctx context.Context, data []byte, off int64) (bool, layer.Errno) {
	fs := h.fs
	path := h.n.tok.Ino
	sf := fs.sfileOf(path, true)
	var size int64
	var wb *wbFid
	sf.mu.Lock()
	for sf.d == nil && !sf.uncached.Load() {
		// The first delayed write: the size and a fid to write back
		// through come from the server, asked without mu (a handle
		// opened again on a new connection takes it).
		sf.mu.Unlock()
		if wb != nil {
			wb.c.Clunk(wb.fid)
		}
		var e layer.Errno
		if size, e = h.size(ctx); e != 0 {
			return true, e
		}
		wb = h.openWriteBack(ctx)
		sf.mu.Lock()
		if sf.d == nil && !sf.uncached.Load() {
			sf.d = &dirty{size: size, since: time.Now()}
			sf.hasDirty.Store(true)
			sf.wb, wb = wb, nil
		}
	}
	if wb != nil {
		defer wb.c.Clunk(wb.fid)
	}
	if sf.uncached.Load() {
		sf.mu.Unlock()
		return false, 0
	}
	added, replaced := sf.d.write(off, data)
	sf.d.mtime = time.Now()
	sf.setNode(h.n)
	sf.uid = h.uid
	sf.mu.Unlock()
	fs.dirtyBytes.Add(added)
	fs.ctr.discarded.Add(uint64(replaced))
	if fs.dirtyBytes.Load() > fs.dirtyMax {
		fs.writeBackOldest(ctx)
	}
	return true, 0
}

// openWriteBack opens a fid of h's file to write its delayed data back
// through; nil if it cannot now (the write-back then walks by name).
func (h *handle) openWriteBack(ctx context.Context) *wbFid {
	c, e := h.fs.ss.Conn(ctx)
	if e != 0 {
		return nil
	}
	fid, iounit, refused, e := h.n.writeBackOpen(c, h.uid)
	if e != 0 || refused {
		return nil
	}
	return &wbFid{c, fid, iounit}
}

// writeBackOpen opens a new fid of n for uid with journal.WriteBack.
// refused is the server's ESTALE to the open itself (not to the walk: a
// file removed): another client wrote the file since this one did.
func (n *node) writeBackOpen(c *session.Conn, uid uint32) (fid, iounit uint32, refused bool, e layer.Errno) {
	if fid, e = n.newFid(c, uid); e != 0 {
		return 0, 0, false, e
	}
	_, iounit, err := c.Lopen(fid, openFlags(unix.O_WRONLY)|journal.WriteBack)
	if err != nil {
		c.Clunk(fid)
		e := session.Errno(err)
		return 0, 0, e == syscall.ESTALE, e
	}
	return fid, iounit, false, 0
}

// size is the file's size on the server, from the cache if it has it.
func (h *handle) size(ctx context.Context) (int64, layer.Errno) {
	if a, gen, ok := h.fs.cc.Attr(h.n.tok.Ino); ok && gen == h.n.tok.Gen {
		return int64(a.Size), 0
	}
	var size int64
	var e layer.Errno
	h.fs.ss.UntilNotLost(ctx, func() bool {
		var c *session.Conn
		var fid uint32
		if c, fid, _, e = h.use(ctx); e != 0 {
			return false
		}
		ra, err := c.Getattr(fid)
		if err != nil {
			e = session.Errno(err)
			return errors.Is(err, session.ErrLost)
		}
		size = int64(ra.Attr.Size)
		return false
	})
	return size, e
}

// readDirty reads what the file holds for this client: dirty data over
// what the server has. ok is false if the file has no dirty data.
func (h *handle) readDirty(ctx context.Context, dest []byte, off int64) (int, bool, layer.Errno) {
	sf := h.fs.sfileOf(h.n.tok.Ino, false)
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
			sf.mu.Unlock()
			return n, true, 0
		}
		gen := sf.gen
		sf.mu.Unlock()
		k, e := h.readClean(ctx, dest[:n], off)
		if e != 0 {
			return 0, true, e
		}
		sf.mu.Lock()
		if sf.gen != gen || sf.d == nil {
			sf.mu.Unlock()
			continue // a write-back crossed the read: read again
		}
		clear(dest[k:n]) // a hole, or past the server's end
		sf.d.overlay(dest[:n], off)
		sf.mu.Unlock()
		return n, true, 0
	}
}

// wbGen is path's count of write-backs and discards (sfile.gen), taken
// before asking the server for its attributes: see overlayAttrSince.
func (fs *FS) wbGen(path uint64) uint64 {
	sf := fs.sfileOf(path, false)
	if sf == nil {
		return 0
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return sf.gen
}

// overlayAttrSince is overlayAttr for attributes the server gave after
// wbGen returned gen; false if a write-back ran meanwhile: they may be
// from before it, with the dirty data it sent no longer there to show,
// so they must be asked again.
func (fs *FS) overlayAttrSince(path uint64, a *layer.Attr, gen uint64) bool {
	sf := fs.sfileOf(path, false)
	if sf == nil {
		return true
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.gen != gen {
		return false
	}
	sf.overlayLocked(a)
	return true
}

// overlayAttr shows path's dirty data in its attributes.
func (fs *FS) overlayAttr(path uint64, a *layer.Attr) {
	sf := fs.sfileOf(path, false)
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
		if d.mtime.After(a.Mtime) {
			a.Mtime = d.mtime
		}
		if d.mtime.After(a.Ctime) {
			a.Ctime = d.mtime
		}
	}
}

// beforeSetattr prepares a setattr of path: a change of times writes the
// dirty data back first (its write would move them again). The returned
// func ends it, after the Tsetattr, told whether the server made it: a
// change of size then cuts the dirty data too. The file stays locked
// against write-backs meanwhile.
func (fs *FS) beforeSetattr(ctx context.Context, path uint64, in *layer.SetAttr) func(made bool) {
	sf := fs.sfileOf(path, false)
	if sf == nil || !sf.hasDirty.Load() {
		return func(bool) {}
	}
	sf.mu.Lock()
	if sf.d != nil && in.Valid&(layer.SetAtime|layer.SetAtimeNow|layer.SetMtime|layer.SetMtimeNow) != 0 {
		fs.writeBackLocked(ctx, sf, wbSetattr)
	}
	return func(made bool) {
		if made && in.Valid&layer.SetSize != 0 {
			fs.truncateLocked(sf, int64(in.Size))
		}
		sf.mu.Unlock()
	}
}

// truncated cuts path's dirty data at size: the server's file was cut.
func (fs *FS) truncated(path uint64, size int64) {
	sf := fs.sfileOf(path, false)
	if sf == nil || !sf.hasDirty.Load() {
		return
	}
	sf.mu.Lock()
	fs.truncateLocked(sf, size)
	sf.mu.Unlock()
}

func (fs *FS) truncateLocked(sf *sfile, size int64) {
	if sf.d == nil {
		return
	}
	dropped := sf.d.truncate(size)
	fs.dirtyBytes.Add(-dropped)
	fs.ctr.discarded.Add(uint64(dropped))
	if len(sf.d.ext) == 0 {
		// The server's file is what this client sees now.
		sf.settled()
	}
}

// settled ends sf's dirty state: written back, or never to be. The node
// it wrote back through may go now (see node.Forget).
func (sf *sfile) settled() {
	sf.d = nil
	sf.hasDirty.Store(false)
	sf.gen++
	sf.setNode(nil)
}

// setNode makes n the node sf's dirty data is written back through,
// pinned in the tree until settled: the kernel forgets nodes when it
// likes (a reconnection's invalidation of everything makes it), and a
// write-back on a new connection walks by the node's path.
func (sf *sfile) setNode(n *node) {
	if sf.n == n {
		return
	}
	if n != nil {
		n.pin()
	}
	if old := sf.n; old != nil {
		old.unpin()
	}
	sf.n = n
}

// unlinked discards the dirty data of a file whose last name this client
// removed, unless a handle still has it open: it never reaches the
// server.
func (fs *FS) unlinked(path uint64) {
	sf := fs.sfileOf(path, false)
	if sf == nil || !sf.hasDirty.Load() {
		return
	}
	if a, _, ok := fs.cc.Attr(path); !ok || a.Nlink > 1 {
		return // other names may remain: written back as usual
	}
	sf.mu.Lock()
	if len(sf.writers) == 0 {
		fs.discardLocked(sf)
	}
	sf.mu.Unlock()
}

func (fs *FS) discardLocked(sf *sfile) {
	if sf.d != nil {
		fs.ctr.discarded.Add(uint64(sf.d.bytes()))
		fs.dropDirtyLocked(sf)
	}
}

// dropDirtyLocked forgets sf's dirty data, counted by the caller.
func (fs *FS) dropDirtyLocked(sf *sfile) {
	if sf.d == nil {
		return
	}
	fs.dirtyBytes.Add(-sf.d.bytes())
	sf.settled()
	if wb := sf.wb; wb != nil {
		sf.wb = nil
		wb.c.Clunk(wb.fid)
	}
}

// writeBack writes path's dirty data back, for why.
func (fs *FS) writeBack(ctx context.Context, path uint64, why int) layer.Errno {
	sf := fs.sfileOf(path, false)
	if sf == nil || !sf.hasDirty.Load() {
		return 0
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return fs.writeBackLocked(ctx, sf, why)
}

// writeBackLocked writes sf's dirty data to the server, through a
// handle of the file open for writing, or a fid opened for the purpose
// (journal.WriteBack: the server counts no open of a program). Data this
// client unlinked or replaced the file of goes, as it would locally; data
// that cannot be written back otherwise (another client wrote, removed
// or renamed the file, the server refused) is kept in a conflict copy
// (lost.go). A lost connection keeps it and is waited for; the
// reconnection reclaims the data first.
func (fs *FS) writeBackLocked(ctx context.Context, sf *sfile, why int) layer.Errno {
	var e layer.Errno
	fs.ss.UntilNotLost(ctx, func() (lost bool) {
		e, lost = fs.writeBackOnce(ctx, sf, why)
		return lost
	})
	return e
}

func (fs *FS) writeBackOnce(ctx context.Context, sf *sfile, why int) (layer.Errno, bool) {
	d := sf.d
	if d == nil {
		return 0, false
	}
	if sf.refused.Swap(false) {
		return fs.lostLocked(sf, "the server restarted and another client wrote the file before this one reclaimed its writes"), false
	}
	c, fid, iounit, done, refused, e := fs.writeBackFid(ctx, sf)
	switch {
	case refused:
		return fs.lostLocked(sf, "another client wrote the file while this one could not reach the server"), false
	case e == syscall.ESTALE || e == syscall.ENOENT:
		if _, pe := sf.n.path(); pe != 0 {
			// This client removed its last name, or renamed another
			// file over it: as a local file's, its data goes.
			fs.discardLocked(sf)
			return 0, false
		}
		return fs.lostLocked(sf, "another client removed or renamed the file"), false
	case e != 0:
		return e, e == syscall.EIO // EIO: the connection went, or none came
	}
	defer done()
	for _, x := range d.ext {
		k, err := c.WriteAt(fid, iounit, x.data, x.off)
		fs.ctr.writeServerBytes.Add(uint64(k))
		if err != nil {
			if errors.Is(err, session.ErrLost) {
				return syscall.EIO, true // kept, to write again
			}
			return fs.lostLocked(sf, "the server refused the write: "+session.Errno(err).Error()), false
		}
	}
	// The file's modification time is when the program wrote, not when
	// the data reached the server: make and its kind compare them. Only
	// the owner may set it; others' write-backs leave the server's.
	c.SetMtime(fid, d.mtime)
	n := d.bytes()
	fs.dirtyBytes.Add(-n)
	for _, x := range d.ext {
		fs.cc.DropData(sf.path, uint64(x.off), uint64(len(x.data)))
	}
	fs.cc.DropAttrs(sf.path)
	sf.settled()
	fs.ctr.writeBacks[why].Add(1)
	if why != wbRecall && why != wbUncache {
		fs.cleanLocked(sf) // a Recall's answer says as much
	}
	return 0, false
}

// cleanLocked tells the server, if no handle of this client can write
// the file, that the client holds nothing dirty of it (a Clean of its
// own, with the version of its last open for writing), so that the next
// open elsewhere needs no recall. Sent in the background.
func (fs *FS) cleanLocked(sf *sfile) {
	if len(sf.writers) > 0 || sf.d != nil || !sf.known || fs.jr == nil {
		return
	}
	r := journal.Record{Kind: journal.Clean, Qid: p9wire.Qid{Path: sf.path, Vers: sf.version}}
	go func() {
		fs.jr.send(r)
		fs.ctr.cleans.Add(1)
	}()
}

// writeBackFid is a fid to write sf's file through. refused is the
// server's ESTALE to the open itself (not to the walk: a file removed).
func (fs *FS) writeBackFid(ctx context.Context, sf *sfile) (c *session.Conn, fid, iounit uint32, done func(), refused bool, e layer.Errno) {
	if c, e = fs.ss.Conn(ctx); e != 0 {
		return nil, 0, 0, noop, false, e
	}
	if wb := sf.wb; wb != nil {
		sf.wb = nil
		if wb.c == c {
			return c, wb.fid, wb.iounit, func() { c.Clunk(wb.fid) }, false, 0
		}
	}
	// A handle open on this connection; not one to open again, which
	// would count as a program's open (and take sf.mu).
	for h := range sf.writers {
		h.mu.Lock()
		fid, iounit, ok := h.fid, h.iounit, h.c == c && !h.released
		h.mu.Unlock()
		if ok {
			return c, fid, iounit, noop, false, 0
		}
	}
	if fid, iounit, refused, e = sf.n.writeBackOpen(c, sf.uid); e != 0 {
		return nil, 0, 0, noop, refused, e
	}
	return c, fid, iounit, func() { c.Clunk(fid) }, false, 0
}

// writeBackOldest writes back the files dirty longest until at most
// DirtyMax is dirty: memory is short.
func (fs *FS) writeBackOldest(ctx context.Context) {
	for fs.dirtyBytes.Load() > fs.dirtyMax {
		var oldest *sfile
		var at time.Time
		for _, sf := range fs.dirtyFiles() {
			sf.mu.Lock()
			if sf.d != nil && (oldest == nil || sf.d.since.Before(at)) {
				oldest, at = sf, sf.d.since
			}
			sf.mu.Unlock()
		}
		if oldest == nil || fs.writeBack(ctx, oldest.path, wbMemory) != 0 {
			return
		}
	}
}

// dirtyFiles is the files with dirty data.
func (fs *FS) dirtyFiles() []*sfile {
	fs.smu.Lock()
	defer fs.smu.Unlock()
	var sfs []*sfile
	for _, sf := range fs.sfiles {
		if sf.hasDirty.Load() {
			sfs = append(sfs, sf)
		}
	}
	return sfs
}

// flusher writes back what has been dirty for the write delay, until
// the client closes.
func (fs *FS) flusher() {
	tick := min(fs.writeDelay/4, time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-fs.done:
			return
		case <-t.C:
		}
		now := time.Now()
		fs.sample(now)
		for _, sf := range fs.dirtyFiles() {
			sf.mu.Lock()
			if sf.d != nil && now.Sub(sf.d.since) >= fs.writeDelay {
				fs.writeBackLocked(context.Background(), sf, wbAge)
			}
			sf.mu.Unlock()
		}
	}
}

// writeBackAll writes every dirty file back, for why.
func (fs *FS) writeBackAll(ctx context.Context, why int) {
	for _, sf := range fs.dirtyFiles() {
		fs.writeBack(ctx, sf.path, why)
	}
}

// leaving is the end of the client, its dirty data written back: what
// could not be is said, a line a file; with nothing left, the server is
// told (a goodbye), so that it waits for no recall of ours.
func (fs *FS) leaving() {
	left := fs.dirtyFiles()
	for _, sf := range left {
		sf.mu.Lock()
		if sf.d != nil {
			fs.lostLocked(sf, "the client ended and the server could not be reached")
		}
		sf.mu.Unlock()
	}
	if len(left) == 0 && fs.jr != nil && fs.sprite.Load() {
		fs.jr.send(journal.Record{Kind: journal.Clean, Seq: journal.Goodbye})
	}
}

// recalled answers a Recall or an Uncache of path (record seq): the
// dirty data goes back to the server, and with uncache the file is
// cached no more; then a Clean tells the server.
func (fs *FS) recalled(path, seq uint64, uncache bool) {

	ctx := context.Background()
	why := wbRecall
	if uncache {
		why = wbUncache
		fs.ctr.uncaches.Add(1)
	} else {
		fs.ctr.recalls.Add(1)
	}
	if sf := fs.sfileOf(path, uncache); sf != nil {
		sf.mu.Lock()
		drop := uncache && !sf.uncached.Load()
		if uncache {
			sf.uncaches++
			sf.uncached.Store(true)
		}
		fs.writeBackLocked(ctx, sf, why)
		sf.mu.Unlock()
		if drop {
			// Not under mu: the kernel's invalidation waits for reads in
			// flight, which may want it.
			fs.cc.DropData(path, 0, 0)
			fs.notice(layer.Event{Kind: layer.Data, Token: layer.Token{Ino: path, Gen: fs.genOf(path)}})
		}
	}
	fs.jr.send(journal.Record{Kind: journal.Clean, Seq: seq, Qid: p9wire.Qid{Path: path}})
}

// reclaim tells a Sprite server, on a new connection and before anything
// else, which files this client holds dirty data of (one Dirty a write,
// so that a refusal names its file), then says hello.
func (j *jreader) reclaim(c *session.Conn, fid uint32) error {
	fs := j.fs
	for _, sf := range fs.dirtyFiles() {
		b := journal.Append(nil, &journal.Record{Kind: journal.Dirty, Qid: p9wire.Qid{Path: sf.path}})
		if _, err := c.WriteAt(fid, 0, b, 0); err != nil {
			if errors.Is(err, session.ErrLost) {
				return err
			}
			sf.refused.Store(true) // told at its write-back, which follows at once
			fs.ctr.reclaimsRefused.Add(1)
		}
	}
	b := journal.Append(nil, &journal.Record{Kind: journal.Clean})
	_, err := c.WriteAt(fid, 0, b, 0)
	return err
}

// send writes a record to the journal of the current connection; lost
// with the connection (the server's wait then ends with its lease).
func (j *jreader) send(r journal.Record) {
	j.mu.Lock()
	c, fid := j.cur, j.fid
	j.mu.Unlock()
	if c == nil {
		return
	}
	c.WriteAt(fid, 0, journal.Append(nil, &r), 0)
}
