// Package cache is the journal cache of shale's 9P client (remote): what
// the server answered, kept while the server's journal says it is
// current, in memory or on disk (disk.go). It does no I/O to the server:
// the client asks, puts the answers here, and applies the journal's
// records as drops.
package cache

import (
	"container/list"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shalefs/shale/layer"
)

// The cache holds what the server answered, by QID path (a node token's
// Ino), for as long as the journal says it is current: attributes, names
// looked up in directories (negative ones too), complete listings,
// symlink targets, extended attributes (values, absent names, lists) and
// file data in blocks. It is on only while a journal controller answers
// (remote/callbacks.go); off, every method misses and every put is dropped,
// which is the client without a cache.
//
// Races with the journal: an answer read from the server before a change
// can arrive after the change's record was applied. So every fetch takes
// a snapshot of the invalidation clock before it asks the server, and a
// put is refused when anything about the QIDs it fills was invalidated
// since (a record, a change of our own, a Dropped report, or everything).
//
// Permissions: a cached answer would skip the server's permission checks,
// so a lookup hit needs the caller's uid to have walked the directory on
// the server (search permission), a listing hit to have opened it, a lazy
// open for reading to have opened the file for reading; the uids go with
// the attributes, which every change of mode, owner or ACL drops. An
// extended attribute's answer keeps the uids the server gave it to (a
// user.* one needs read permission).
type Cache struct {
	On atomic.Bool

	mu      sync.Mutex
	ents    map[uint64]*centry
	lru     list.List // *centry, least recently used first
	maxEnts int
	blocks  BlockStore
	// dropped are QIDs evicted, to report to the controller.
	dropped []uint64
	Live    func(path uint64) bool // whether a node of the QID is given out

	clock  uint64 // counts invalidations
	floor  uint64 // clock at the last drop of everything
	recent [ringSize]inval
}

// BlockSize is the unit of cached file data.
const BlockSize = 128 << 10

// ringSize bounds the invalidations a fetch in flight is checked against;
// one that began longer ago than that many is refused.
const ringSize = 4096

type inval struct{ clock, path uint64 }

// centry is what is cached about one QID.
type centry struct {
	path uint64
	gen  uint64 // the token's generation, for events and block keys
	elem *list.Element

	attr    layer.Attr
	hasAttr bool
	// uids that walked through (search), listed, or opened for reading
	// on the server: what a hit may grant without asking it.
	search, lister, reader []uint32

	names   map[string]uint64 // name → child QID path; 0: no such name
	list    []layer.DirEntry
	hasList bool
	link    []byte
	hasLink bool
	blks    map[int64]int // block index → its length (< BlockSize: the end of the file)
	// xattrs are getxattr's answers by name, and listxattr's under "".
	xattrs map[string]XattrVal
}

// XattrVal is a cached answer about one extended attribute (or the list
// of names), exported for the disk cache's gob.
type XattrVal struct {
	Val    []byte
	Absent bool     // ENODATA
	Uids   []uint32 // those the server answered it to
}

// BlockStore keeps file data: in memory, or in the object store.
type BlockStore interface {
	get(path, gen uint64, idx int64) ([]byte, bool)
	put(path, gen uint64, idx int64, b []byte) bool
	drop(path, gen uint64, idx int64)
	bytes() int64
}

func New(maxEnts int, blocks BlockStore) *Cache {
	return &Cache{ents: map[uint64]*centry{}, maxEnts: maxEnts, blocks: blocks, Live: func(uint64) bool { return false }}
}

// Snap is the clock to give a later put.
func (c *Cache) Snap() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clock
}

// changedLocked tells whether anything about path was invalidated after
// snapshot since.
func (c *Cache) changedLocked(path, since uint64) bool {
	if since < c.floor || c.clock-since >= ringSize {
		return since != c.clock
	}
	for k := since + 1; k <= c.clock; k++ {
		if c.recent[k%ringSize].path == path {
			return true
		}
	}
	return false
}

// Changed tells whether anything about path was invalidated after
// snapshot since: an answer asked before may be older than the change.
func (c *Cache) Changed(path, since uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changedLocked(path, since)
}

// tickLocked records an invalidation of path.
func (c *Cache) tickLocked(path uint64) {
	c.clock++
	c.recent[c.clock%ringSize] = inval{c.clock, path}
}

// entLocked returns path's entry, made if need be, as most recently used.
func (c *Cache) entLocked(path, gen uint64) *centry {
	e := c.ents[path]
	if e != nil && gen != 0 && e.gen != 0 && e.gen != gen {
		// Another file with the inode number: nothing of the old holds.
		c.removeLocked(e)
		e = nil
	}
	if e == nil {
		e = &centry{path: path, gen: gen}
		c.ents[path] = e
		e.elem = c.lru.PushBack(e)
		for c.lru.Len() > c.maxEnts {
			o := c.lru.Front().Value.(*centry)
			c.removeLocked(o)
			if !c.Live(o.path) {
				c.dropped = append(c.dropped, o.path)
			}
		}
		return e
	}
	if e.gen == 0 {
		e.gen = gen
	}
	c.lru.MoveToBack(e.elem)
	return e
}

// getLocked returns path's entry if there is one, marking it used.
func (c *Cache) getLocked(path uint64) *centry {
	e := c.ents[path]
	if e != nil {
		c.lru.MoveToBack(e.elem)
	}
	return e
}

func (c *Cache) removeLocked(e *centry) {
	c.dropDataLocked(e, 0, 0)
	c.lru.Remove(e.elem)
	delete(c.ents, e.path)
}

// dropDataLocked forgets e's blocks that overlap [off, off+n) (n 0: to
// the end), and the one that ended the file, which a write past it
// changes wherever it was.
func (c *Cache) dropDataLocked(e *centry, off, n uint64) {
	for idx, l := range e.blks {
		start := uint64(idx) * BlockSize
		end := start + BlockSize
		if l < BlockSize || end > off && (n == 0 || start < off+n) {
			c.blocks.drop(e.path, e.gen, idx)
			delete(e.blks, idx)
		}
	}
}

func (e *centry) dropAttrLocked() {
	e.hasAttr = false
	e.search, e.lister, e.reader = nil, nil, nil
}

// Drops, for records and for changes of our own. Each ticks the clock,
// even with nothing cached: a fetch in flight must not put what it read.

// DropAttrs forgets the attributes, the permissions they gave and the
// extended attributes (an Attrs record stands for any of them).
func (c *Cache) DropAttrs(path uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickLocked(path)
	if e := c.ents[path]; e != nil {
		e.dropAttrLocked()
		e.xattrs = nil
	}
}

// AtimeMoved is told that our read or listing on the server, at time at
// by our clock, moved path's atime (Touches said it would). The cached
// atime becomes at, or just after mtime and ctime if our clock is behind
// the server's, as relatime leaves it; nothing else moved. Dropping the
// attributes instead cost a walk and a Tgetattr per file read: a build's
// sources, looked up again at its next listing (READDIRPLUS). The server's
// own value differs from ours by the clocks' skew and the reply's way.
// A zero at says the atime may have moved, or not: the attributes go.
func (c *Cache) AtimeMoved(path uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickLocked(path)
	if e := c.ents[path]; e != nil && at.IsZero() {
		e.hasAttr = false
	} else if e != nil && e.hasAttr {
		a := &e.attr
		for _, t := range []time.Time{a.Mtime, a.Ctime} {
			if !at.After(t) {
				at = t.Add(time.Nanosecond)
			}
		}
		a.Atime = at
	}
}

// DropData forgets the attributes, the data in [off, off+n), and the
// extended attribute a write removes (the server's kernel kills
// security.capability) with a list that names it; others stay. Who may
// read the file stays: a write leaves its permission bits, owner and ACL
// as they were (a write-back of the creator's output dropped the grant
// its create made, and the next open for reading asked the server).
func (c *Cache) DropData(path, off, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickLocked(path)
	if e := c.ents[path]; e != nil {
		e.hasAttr = false
		c.dropDataLocked(e, off, n)
		if x, ok := e.xattrs[capability]; ok && !x.Absent {
			delete(e.xattrs, capability)
		}
		if x, ok := e.xattrs[""]; ok && slices.Contains(strings.Split(string(x.Val), "\x00"), capability) {
			delete(e.xattrs, "")
		}
	}
}

// capability is the extended attribute a write removes.
const capability = "security.capability"

// DropEntry forgets name in directory path, its listing and attributes
// (its mtime and ctime moved). Who may search and list it stays: a
// change of its names leaves its mode, owner and ACL as they were (a
// change of those comes as an Attrs record: DropAttrs).
func (c *Cache) DropEntry(path uint64, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickLocked(path)
	if e := c.ents[path]; e != nil {
		e.hasAttr = false
		delete(e.names, name)
		e.list, e.hasList = nil, false
	}
}

// Drop forgets everything about path.
func (c *Cache) Drop(path uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickLocked(path)
	if e := c.ents[path]; e != nil {
		c.removeLocked(e)
	}
}

// DropAll forgets everything; fetches in flight put nothing.
func (c *Cache) DropAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.ents {
		c.dropDataLocked(e, 0, 0)
	}
	c.ents = map[uint64]*centry{}
	c.lru.Init()
	c.dropped = nil
	c.clock++
	c.floor = c.clock
}

// ChildOf is the QID path cached for name in directory dir, if any.
func (c *Cache) ChildOf(dir uint64, name string) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[dir]; e != nil {
		p, ok := e.names[name]
		return p, ok && p != 0
	}
	return 0, false
}

// GenOf is the generation known for path, 0 if none.
func (c *Cache) GenOf(path uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[path]; e != nil {
		return e.gen
	}
	return 0
}

// TakeDropped returns the QIDs evicted since the last call that no node
// holds, and ticks the clock for each: until the controller has read the
// report, nothing read about them may be kept.
func (c *Cache) TakeDropped() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint64
	for _, p := range c.dropped {
		if c.ents[p] == nil && !c.Live(p) {
			out = append(out, p)
			c.tickLocked(p)
		}
	}
	c.dropped = nil
	return out
}

// Size is the QIDs cached and the bytes of file data held.
func (c *Cache) Size() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ents), c.blocks.bytes()
}

// Lookups and attributes.

// Attr returns path's cached attributes and generation.
func (c *Cache) Attr(path uint64) (layer.Attr, uint64, bool) {
	if !c.On.Load() {
		return layer.Attr{}, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.getLocked(path); e != nil && e.hasAttr {
		return e.attr, e.gen, true
	}
	return layer.Attr{}, 0, false
}

// Lookup answers name in directory dir for uid: the child's QID path,
// generation and attributes, or found=false for a name known absent.
// ok=false is a miss.
func (c *Cache) Lookup(dir uint64, name string, uid uint32) (child, gen uint64, a layer.Attr, found, ok bool) {
	if !c.On.Load() {
		return 0, 0, a, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.getLocked(dir)
	if d == nil || !slices.Contains(d.search, uid) {
		return 0, 0, a, false, false
	}
	p, known := d.names[name]
	if !known {
		return 0, 0, a, false, false
	}
	if p == 0 {
		return 0, 0, a, false, true
	}
	ch := c.getLocked(p)
	if ch == nil || !ch.hasAttr {
		return 0, 0, a, false, false
	}
	return p, ch.gen, ch.attr, true, true
}

// put runs fill on path's entry (of generation gen; 0: whatever it is)
// if caching is on and nothing touched path since snapshot since: an
// answer that crossed a change must not be kept.
func (c *Cache) put(since, path, gen uint64, fill func(e *centry)) {
	if !c.On.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changedLocked(path, since) {
		return
	}
	fill(c.entLocked(path, gen))
}

// PutAttr keeps path's attributes, read after snapshot since.
func (c *Cache) PutAttr(since, path, gen uint64, a *layer.Attr) {
	c.put(since, path, gen, func(e *centry) { e.attr, e.hasAttr = *a, true })
}

// PutLookup keeps that uid walked name in dir to child, whose attributes
// are a (child 0: the name does not exist).
func (c *Cache) PutLookup(since, dir uint64, name string, uid uint32, child, gen uint64, a *layer.Attr) {
	if !c.On.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changedLocked(dir, since) || child != 0 && c.changedLocked(child, since) {
		return
	}
	if child != 0 {
		e := c.entLocked(child, gen)
		e.attr, e.hasAttr = *a, true
	}
	d := c.entLocked(dir, 0)
	if d.names == nil {
		d.names = map[string]uint64{}
	}
	d.names[name] = child
	d.search = addUid(d.search, uid)
}

// AfterDropped ticks the clock for paths, reported as dropped, and
// returns those that a fetch made cached or live meanwhile, dropping
// what the cache has of them: the controller may no longer tell of them.
func (c *Cache) AfterDropped(paths []uint64) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var back []uint64
	for _, p := range paths {
		c.tickLocked(p)
		e := c.ents[p]
		if e != nil {
			c.removeLocked(e)
		}
		if e != nil || c.Live(p) {
			back = append(back, p)
		}
	}
	return back
}

// Gone notes that no node of path is given out any more: if nothing is
// cached of it either, the controller may forget it.
func (c *Cache) Gone(path uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ents[path] == nil && c.On.Load() {
		c.dropped = append(c.dropped, path)
	}
}

// Touches tells whether a read of path on the server would change its
// atime under relatime (the Linux default): atime not after mtime or
// ctime, or a day old; or whether nothing says otherwise. Such reads go
// to the server, and drop the attributes, so a stat shows the new atime.
func (c *Cache) Touches(path uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.ents[path]
	if e == nil || !e.hasAttr {
		return true
	}
	a := &e.attr
	return !a.Atime.After(a.Mtime) || !a.Atime.After(a.Ctime) || time.Since(a.Atime) > 24*time.Hour
}
