package volume

import (
	"slices"
	"sync"
)

// mcache is what this client knows of the volume's inodes, directory
// entries and extended attributes, kept current by its etcd watch: a
// lookup or a stat is answered from it, and a transaction takes its
// values as read (Tx.Assume) and compares their revisions at commit, so
// that a create or a remove is one round trip. It answers only while the
// watch is caught up (live): a change made elsewhere shows here within
// one watch delivery, as it does in the kernel's caches the watch
// invalidates. While the watch is down nothing is answered from it.
//
// Every entry carries the revision it is known as of (at): a change the
// watch delivers replaces it only if later, and a read is kept only if
// the watch has not passed the revision it was made at (w), so that no
// change it delivered is lost under an older read. Its lock is taken
// alone.
type mcache struct {
	mu    sync.Mutex
	live  bool
	nonce string // the sync mark the watch must deliver to be live again
	w     int64  // the revision the watch has delivered up to
	ino   map[uint64]centry
	dirs  map[uint64]*cdir
	xa    map[uint64]*cdir // an inode's xattrs, as a directory's entries
	n     int              // entries, for the bound
}

type centry struct {
	Value       // Val nil: known absent
	at    int64 // the revision it is known as of
}

// cdir is what is known of a directory's entries; full: all of them,
// so that a name not there is known absent.
type cdir struct {
	full  bool
	at    int64
	names map[string]centry
}

// mcacheMax bounds the entries kept; past it all are dropped.
const mcacheMax = 1 << 20

func (c *mcache) reset() {
	c.ino = map[uint64]centry{}
	c.dirs = map[uint64]*cdir{}
	c.xa = map[uint64]*cdir{}
	c.n = 0
}

// get is key's value if known and the watch is live.
func (c *mcache) get(k keys, key string) (Value, bool) {
	kind, ino, name := k.parse(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return Value{}, false
	}
	switch kind {
	case 'i':
		if name == "" {
			e, ok := c.ino[ino]
			return e.Value, ok
		}
	case 'd':
		return c.dirs[ino].get(name)
	case 'x':
		return c.xa[ino].get(name)
	}
	return Value{}, false
}

// set records v as key's value at revision at, unless what is known
// is as recent; under c.mu.
func (c *mcache) set(k keys, key string, v Value, at int64, insert bool) {
	kind, ino, name := k.parse(key)
	switch kind {
	case 'i':
		if name != "" {
			return
		}
		e, ok := c.ino[ino]
		if ok && e.at >= at || !ok && !insert {
			return
		}
		if !ok {
			c.n++
		}
		c.ino[ino] = centry{v, at}
		if v.Val == nil {
			if d := c.dirs[ino]; d != nil {
				c.n -= len(d.names)
				delete(c.dirs, ino)
			}
		}
	case 'd':
		c.setIn(c.dirs, ino, name, centry{v, at}, insert)
	case 'x':
		c.setIn(c.xa, ino, name, centry{v, at}, insert)
	}
	if c.n > mcacheMax {
		c.reset()
	}
}

// setIn sets name of ino's cdir in m to e, unless what is known is as
// recent; a name not known is added if insert, or if ino's are known whole.
func (c *mcache) setIn(m map[uint64]*cdir, ino uint64, name string, e centry, insert bool) {
	d := m[ino]
	if d == nil {
		if !insert {
			return
		}
		d = &cdir{names: map[string]centry{}}
		m[ino] = d
	}
	old, ok := d.names[name]
	if ok && old.at >= e.at || !ok && !insert && !d.full {
		return
	}
	if !ok {
		c.n++
	}
	d.names[name] = e
}

// get is name's value if known: absent if d is known whole.
func (d *cdir) get(name string) (Value, bool) {
	if d == nil {
		return Value{}, false
	}
	e, ok := d.names[name]
	return e.Value, ok || d.full
}

// read records what a read outside a transaction found at revision rev.
func (c *mcache) read(k keys, rev int64, ks []string, vs []Value) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev < c.w {
		return // the watch may have told a later change of it already
	}
	for i, key := range ks {
		c.set(k, key, vs[i], rev, true)
	}
}

// listed records directory dir's entries, all of them, read at rev.
func (c *mcache) listed(k keys, dir uint64, rev int64, kvs []KV) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev < c.w {
		return
	}
	d := &cdir{full: true, at: rev, names: make(map[string]centry, len(kvs))}
	if old := c.dirs[dir]; old != nil {
		c.n -= len(old.names)
	}
	c.dirs[dir] = d
	prefix := k.dir(dir)
	for _, kv := range kvs {
		d.names[kv.Key[len(prefix):]] = centry{Value{Val: kv.Val, Mod: kv.Mod}, rev}
	}
	c.n += len(kvs)
}

// names is directory dir's entries, in name order, if all are known.
func (c *mcache) names(dir uint64) ([]KV, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dirs[dir]
	if !c.live || d == nil || !d.full {
		return nil, false
	}
	out := make([]KV, 0, len(d.names))
	for name, e := range d.names {
		if e.Val != nil {
			out = append(out, KV{Key: name, Val: e.Val})
		}
	}
	slices.SortFunc(out, func(a, b KV) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out, true
}

// committed records one of our transactions, committed at rev: what it
// read was still so then, and what it wrote is so. It is called before
// the watch can pass rev (FS.land), so nothing the watch delivers is
// older than it. made are the inodes it made: they have no xattrs but
// those it wrote (inode numbers are never reused); madeDirs the
// directories, which have no entries.
func (c *mcache) committed(k keys, rev int64, t *cacheTx, made, madeDirs []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ino := range made {
		c.whole(c.xa, ino, rev)
	}
	for _, dir := range madeDirs {
		c.whole(c.dirs, dir, rev)
	}
	for key, v := range t.reads {
		if _, w := t.writes[key]; !w {
			c.set(k, key, v, rev, true)
		}
	}
	for key, v := range t.writes {
		mod := rev
		if v == nil {
			mod = 0
		}
		c.set(k, key, Value{Val: v, Mod: mod}, rev, true)
	}
	for _, p := range t.prefixes {
		if kind, ino, _ := k.parse(p); kind == 'x' {
			if d := c.xa[ino]; d != nil {
				c.n -= len(d.names)
			}
			delete(c.xa, ino)
		}
	}
}

// whole makes ino's cdir in m known whole and empty as of rev.
func (c *mcache) whole(m map[uint64]*cdir, ino uint64, rev int64) {
	if old := m[ino]; old != nil {
		c.n -= len(old.names)
	}
	m[ino] = &cdir{full: true, at: rev, names: map[string]centry{}}
}

// change applies a change the watch delivered: it replaces what is
// known, and adds an entry of a directory known whole.
func (c *mcache) change(k keys, ch Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w = max(c.w, ch.Rev)
	mod := ch.Rev
	if ch.Val == nil {
		mod = 0
	}
	c.set(k, ch.Key, Value{Val: ch.Val, Mod: mod}, ch.Rev, false)
}

// answers tells whether the cache answers now (the watch is live).
func (c *mcache) answers() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// state follows the watch: down, nothing is answered until it is up and
// has delivered the sync mark nonce (FS.sync) written after it started.
func (c *mcache) down() {
	c.mu.Lock()
	c.live, c.nonce = false, ""
	c.mu.Unlock()
}

func (c *mcache) await(nonce string) {
	c.mu.Lock()
	c.live, c.nonce = false, nonce
	c.mu.Unlock()
}

// awaits tells whether nonce is the sync mark awaited.
func (c *mcache) awaits(nonce string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nonce == nonce && !c.live
}

// marked tells the cache the watch delivered sync mark val.
func (c *mcache) marked(val string) {
	c.mu.Lock()
	if c.nonce != "" && val == c.nonce {
		c.live = true
	}
	c.mu.Unlock()
}

// lost drops everything: the watch could not deliver every change.
func (c *mcache) lost() {
	c.mu.Lock()
	c.reset()
	c.mu.Unlock()
}
