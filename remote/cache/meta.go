package cache

import (
	"slices"

	"github.com/shalefs/shale/layer"
)

func addUid(s []uint32, uid uint32) []uint32 {
	if slices.Contains(s, uid) || len(s) >= 16 {
		return s
	}
	return append(s, uid)
}

// Grant keeps that uid may list (directories) or read (files) path, of
// generation gen (0: whatever is cached; a file that reuses the inode
// number of one cached must say its own, or the grant goes with the
// old file's entry).
func (c *Cache) Grant(since, path, gen uint64, uid uint32, list bool) {
	c.put(since, path, gen, func(e *centry) {
		if list {
			e.lister = addUid(e.lister, uid)
		} else {
			e.reader = addUid(e.reader, uid)
		}
	})
}

// MayRead tells whether uid opened path (of generation gen) for reading
// on the server since its mode, owner or ACL last changed. The grant of
// another file with the inode number says nothing of this one.
func (c *Cache) MayRead(path, gen uint64, uid uint32) bool {
	if !c.On.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.ents[path]
	return e != nil && e.gen == gen && slices.Contains(e.reader, uid)
}

// Extended attributes.

// Xattr answers getxattr of name ("": listxattr) on path for uid: the
// value, or absent for ENODATA. ok=false is a miss.
func (c *Cache) Xattr(path uint64, name string, uid uint32) (val []byte, absent, ok bool) {
	if !c.On.Load() {
		return nil, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(path)
	if e == nil {
		return nil, false, false
	}
	x, ok := e.xattrs[name]
	if !ok || !slices.Contains(x.Uids, uid) {
		return nil, false, false
	}
	return x.Val, x.Absent, true
}

// PutXattr keeps the server's answer to uid about name on path, read
// after snapshot since: val, or absent.
func (c *Cache) PutXattr(since, path, gen uint64, name string, uid uint32, val []byte, absent bool) {
	c.put(since, path, gen, func(e *centry) {
		if e.xattrs == nil {
			e.xattrs = map[string]XattrVal{}
		}
		x, had := e.xattrs[name]
		if !had || x.Absent != absent || string(x.Val) != string(val) {
			// Not the answer the others were given: it is theirs no more.
			x = XattrVal{Val: val, Absent: absent}
		}
		x.Uids = addUid(x.Uids, uid)
		e.xattrs[name] = x
	})
}

// Listings and symlinks.

// Listing returns directory path's complete listing for uid.
func (c *Cache) Listing(path uint64, uid uint32) ([]layer.DirEntry, bool) {
	if !c.On.Load() {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(path)
	if e == nil || !e.hasList || !slices.Contains(e.lister, uid) {
		return nil, false
	}
	return e.list, true
}

// PutListing keeps path's complete listing, read by uid.
func (c *Cache) PutListing(since, path uint64, uid uint32, ents []layer.DirEntry) {
	c.put(since, path, 0, func(e *centry) {
		e.list, e.hasList = ents, true
		e.lister = addUid(e.lister, uid)
	})
}

func (c *Cache) Readlink(path uint64) ([]byte, bool) {
	if !c.On.Load() {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.getLocked(path); e != nil && e.hasLink {
		return slices.Clone(e.link), true
	}
	return nil, false
}

func (c *Cache) PutLink(since, path uint64, target []byte) {
	c.put(since, path, 0, func(e *centry) { e.link, e.hasLink = slices.Clone(target), true })
}

// Data.
