// Package writeback is Sprite's write-behind for shale's 9P client
// (remote; seeds/001, docs/sprite.md), with a server that follows its
// rules (its journal says so: journal.Sprite):
//
//   - every open is a Tlopen, answered with the file's version: an open
//     that finds another version than the one it cached drops the file's
//     data and attributes, here and in the kernels above (Opened);
//   - writes are delayed: kept here as dirty extents (dirty.go) and
//     written back when they have been dirty for the delay, at fsync,
//     when more than DirtyMax is dirty, when the server recalls them (an
//     open on another client), before a setattr of times (but the
//     owner's, kept with the data: KeepTimes), and at
//     unmount (flush.go). Data overwritten, truncated or unlinked first
//     is never sent; data that cannot be written back is kept in a
//     conflict copy (lost.go);
//   - a file the server says is write-shared (NoCache in an open's
//     version, or an Uncache record) is not cached: reads and writes go
//     to the server, until an open of it is answered without NoCache;
//   - after a reconnection the client reclaims its dirty files (Dirty
//     records) before anything else, then says hello (a Clean of no
//     file), which also tells the server it may send Recall and Uncache.
//
// It does not know nodes or handles: a File is what it writes back
// through, a Writer an open handle whose fid it may use.
//
// Lock order: an open's lock (OpenLock, held across its Tlopen), then
// a QID path's Held lock (held across a Held's send: only the path's
// other Helds wait; follow.go), then sfile.mu (held across a write-back:
// only the file's own writes, reads of its delayed data and setattrs
// wait), then sfile.vmu and Files.smu, then the File's own (Pin), the
// cache's and the session's. pathLocks.mu and Files.nmu are taken alone. What a session step runs (Reclaim) takes no sfile lock: a
// write-back holding one may be waiting for that very connection.
package writeback

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/cache"
	"github.com/shalefs/shale/remote/session"
)

// Reason is why a file is written back, for the statistics.
type Reason int

const (
	Age Reason = iota
	Fsync
	Recall
	Uncache
	Memory
	Setattr
	Unmount
	Reset
	Unlink // a name of it goes, and others stay that this client may not know
	NReasons
)

var ReasonNames = [NReasons]string{"age", "fsync", "recall", "uncache", "memory", "setattr", "unmount", "reset", "unlink"}

const (
	defaultDelay    = 30 * time.Second
	defaultDirtyMax = 64 << 20
)

// File is a file as the write-behind writes it back: a node of it.
type File interface {
	// Path is its names from the root; ESTALE if this client removed
	// its last name or renamed another file over it.
	Path() ([]string, layer.Errno)
	// OpenWriteBack opens a new fid of it on c, as uid (credentials:
	// session.Who), to write back through (journal.WriteBack: the server
	// counts no program's open);
	// refused is the server's ESTALE to the open itself (another client
	// wrote the file since this one did), not to the walk.
	OpenWriteBack(c *session.Conn, uid uint32) (fid, iounit uint32, refused bool, e layer.Errno)
	// SetTimes sets its mtime, and its atime unless zero, on c as who:
	// times a program set while its writes were delayed.
	SetTimes(c *session.Conn, who uint32, atime, mtime time.Time) error
	// Removed tells whether this client removed its last name it knew
	// (or renamed another file over it): its data then goes, as a local
	// removed file's, once no handle reads it back.
	Removed() bool
	// Pin keeps it walkable by its path until Unpin, whatever the
	// kernel forgets.
	Pin()
	Unpin()
}

// Writer is an open handle of a file that can write: a write-back may go
// through its fid, if it is on the current connection.
type Writer interface {
	FidOn(c *session.Conn) (fid, iounit uint32, ok bool)
	// Hold opens it on the server, if it is not open there (a handle
	// a delegation opened without a request).
	Hold(ctx context.Context) layer.Errno
}

// Config is what the write-behind is built with.
type Config struct {
	Session  *session.Session
	Cache    *cache.Cache
	Log      *slog.Logger
	Where    string        // the server, for logs and conflict copies
	Delay    time.Duration // 0: 30 s; negative: write through
	DirtyMax int64         // past it the oldest go back; 0: 64 MiB
	LostDir  string        // conflict copies; "": the state directory's lost/
	// Send writes a record to the server's journal (a Clean).
	Send func(journal.Record)
	// Notice tells the views of a change they must drop (the kernel's
	// caches of a file found stale or write-shared).
	Notice func(layer.Event)
	// GenOf is the generation of a QID path's token (0: none known).
	GenOf func(path uint64) uint64
}

// Files is what the client keeps of files under Sprite's rules.
type Files struct {
	Config
	Ctr        Counters
	sprite     atomic.Bool // the server follows the rules
	dirtyBytes atomic.Int64
	settles    atomic.Uint64 // write-backs and discards of every file (GenAll)

	smu    sync.Mutex
	sfiles map[uint64][]*sfile // by QID path
	opens  pathLocks           // one open of a file at a time (OpenLock)
	helds  pathLocks           // one Held of a QID path at a time (follow.go)
	nmu    sync.Mutex
	naming map[uint64]int // name changes in flight, by file (NameChange)
	done   chan struct{}  // closed by Close: ends the flusher
	sizes  sizes

	// followed (under smu) are the QID paths the server sent Follow of,
	// while it has states of them: a state made later is followed
	// (follow.go).
	followed map[uint64]bool
}

// New makes the write-behind and starts its flusher (with a delay).
func New(cfg Config) *Files {
	w := &Files{Config: cfg, sfiles: map[uint64][]*sfile{}, followed: map[uint64]bool{}, naming: map[uint64]int{}, done: make(chan struct{})}
	if w.Delay == 0 {
		w.Delay = defaultDelay
	}
	if w.DirtyMax <= 0 {
		w.DirtyMax = defaultDirtyMax
	}
	if w.LostDir == "" {
		w.LostDir = defaultLostDir()
	}
	if w.Delay > 0 {
		go w.flusher()
	}
	return w
}

// Close ends the flusher; what is dirty stays (Leaving says it).
func (w *Files) Close() { close(w.done) }

// SetSprite says whether the server follows the rules (its journal's
// version, at each connection).
func (w *Files) SetSprite(on bool) { w.sprite.Store(on) }

// Sprite tells whether the server follows the rules.
func (w *Files) Sprite() bool { return w.sprite.Load() }

// Delaying tells whether writes are delayed: a Sprite server, and a
// delay.
func (w *Files) Delaying() bool { return w.sprite.Load() && w.Delay > 0 }

// sfile is what the client keeps of one file under Sprite's rules.
type sfile struct {
	tok      layer.Token // the file: a number reused by a new file is another
	hasDirty atomic.Bool // d != nil, read without mu (reclaim)
	followed atomic.Bool // another client follows it: tell its attributes (follow.go)
	toldHeld atomic.Bool // the last Held of it had delayed writes
	refused  atomic.Bool // the server refused its reclaim
	// gone: forgetIdle took it from the map (set under mu and vmu).
	gone bool

	// vmu guards what opens learn: never held across a request, so that
	// a handle's reopen (which takes it) never waits for a write-back.
	vmu      sync.Mutex
	version  uint32
	known    bool            // version is the server's, as of our last open
	uncaches uint64          // Uncache and Return records applied: one that crossed an open's answer wins
	handles  map[Writer]bool // this client's open handles; true: it may write
	uncached atomic.Bool     // write-shared: no caching of its data (read without a lock)
	deleg    bool            // this client holds a read delegation of it (deleg.go)

	mu sync.Mutex // the dirty data; held across a write-back: writes and reads of dirty data wait
	d  *dirty
	f  File // what the dirty data is written back through, pinned
	// fbox is f, for reads without mu (Reclaim: a write-back waiting
	// for the connection holds mu).
	fbox atomic.Pointer[fileBox]
	uid  uint32        // who wrote last (session.Who): the write-back acts as them
	gen  atomic.Uint64 // write-backs done: a read that crossed one reads again (read without mu)
	err  atomic.Uint32 // a write-back failed (an Errno): told at the next fsync or close, without mu
	// wb is a fid opened for the write-back when the file became dirty,
	// so that it reaches the file whatever happens to its names.
	wb *wbFid
	// linked: this client removed a name of the file while it had
	// others, which it may not know (another client's hard link): with
	// no path left, its dirty data is kept in a conflict copy, never
	// discarded as a removed file's.
	linked bool
}

type wbFid struct {
	c           *session.Conn
	fid, iounit uint32
}

// sfileOf is tok's state, made if make is true (else nil if none).
func (w *Files) sfileOf(tok layer.Token, make bool) *sfile {
	w.smu.Lock()
	defer w.smu.Unlock()
	for _, sf := range w.sfiles[tok.Ino] {
		if sf.tok == tok {
			return sf
		}
	}
	if !make {
		return nil
	}
	sf := &sfile{tok: tok}
	sf.followed.Store(w.followed[tok.Ino])
	w.sfiles[tok.Ino] = append(w.sfiles[tok.Ino], sf)
	return sf
}

// lockedFile is tok's state, made if need be, with mu held.
func (w *Files) lockedFile(tok layer.Token) *sfile {
	for {
		sf := w.sfileOf(tok, true)
		sf.mu.Lock()
		if !sf.gone {
			return sf
		}
		sf.mu.Unlock()
	}
}

// openState is tok's state, made if need be, with vmu held.
func (w *Files) openState(tok layer.Token) *sfile {
	for {
		sf := w.sfileOf(tok, true)
		sf.vmu.Lock()
		if !sf.gone {
			return sf
		}
		sf.vmu.Unlock()
	}
}

// sfilesOf is the states of every file numbered path (a number a new
// file reuses is two files): the journal's records name a QID path
// alone.
func (w *Files) sfilesOf(path uint64) []*sfile {
	w.smu.Lock()
	defer w.smu.Unlock()
	return slices.Clone(w.sfiles[path])
}

// Has tells whether the client keeps anything of tok: its attributes
// may then differ from the server's.
func (w *Files) Has(tok layer.Token) bool { return w.sfileOf(tok, false) != nil }

// forgetIdle drops path's state when nothing in it matters any more:
// no dirty data, no writers, no error, no version worth keeping (the
// cache holds nothing of the file). sf.mu is held.
func (w *Files) forgetIdle(sf *sfile) {
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	if sf.d != nil || len(sf.handles) > 0 || sf.err.Load() != 0 || sf.uncached.Load() || sf.deleg || w.Cache.GenOf(sf.tok.Ino) != 0 {
		return
	}
	// Under both locks: whoever took sf from the map before this looks
	// at gone under either and takes it again.
	sf.gone = true
	w.smu.Lock()
	if sfs := slices.DeleteFunc(w.sfiles[sf.tok.Ino], func(o *sfile) bool { return o == sf }); len(sfs) > 0 {
		w.sfiles[sf.tok.Ino] = sfs
	} else {
		delete(w.sfiles, sf.tok.Ino)
		delete(w.followed, sf.tok.Ino)
	}
	w.smu.Unlock()
}

// settled ends sf's dirty state: written back, or never to be. The file
// it wrote back through may go now.
func (w *Files) settled(sf *sfile) {
	w.settles.Add(1)
	sf.gen.Add(1) // first: whoever finds hasDirty false then sees the new count
	sf.d = nil
	sf.hasDirty.Store(false)
	sf.setFile(nil)
	if wb := sf.wb; wb != nil {
		sf.wb = nil
		wb.c.Clunk(wb.fid)
	}
}

// setFile makes f what sf's dirty data is written back through, pinned
// until settled: the kernel forgets nodes when it likes (a reconnection's
// invalidation of everything makes it), and a write-back on a new
// connection walks by the node's path.
func (sf *sfile) setFile(f File) {
	if sf.f == f {
		return
	}
	if f != nil {
		f.Pin()
	}
	if old := sf.f; old != nil {
		old.Unpin()
	}
	sf.f = f
	sf.fbox.Store(&fileBox{f})
}

type fileBox struct{ f File }

// dirtyFiles is the files with dirty data.
func (w *Files) dirtyFiles() []*sfile {
	w.smu.Lock()
	defer w.smu.Unlock()
	var sfs []*sfile
	for _, l := range w.sfiles {
		for _, sf := range l {
			if sf.hasDirty.Load() {
				sfs = append(sfs, sf)
			}
		}
	}
	return sfs
}

// writing tells whether a handle of this client may write the file.
func (sf *sfile) writing() bool {
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	for _, write := range sf.handles {
		if write {
			return true
		}
	}
	return false
}

// held tells whether a handle of this client has the file open: one that
// may read its delayed data back, which stays until the last closes.
func (sf *sfile) held() bool {
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	return len(sf.handles) > 0
}

// named tells whether the file has a name this client knows: one it
// removed has none, and its delayed data goes nowhere.
func (sf *sfile) named() bool {
	b := sf.fbox.Load()
	if b == nil || b.f == nil {
		return false
	}
	_, e := b.f.Path()
	return e == 0
}
