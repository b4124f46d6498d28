package volume

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
)

// ntx is one namespace operation's transaction: the inodes it read,
// changed in place and written back once at commit, whatever the order of
// the steps (a rename within one directory changes its one inode twice).
type ntx struct {
	fs     *FS
	tx     Tx
	inodes map[uint64]*Inode // nil: read, absent
	dirty  map[uint64]bool
	freed  []string // objects no longer referenced
	now    int64
	lease  int64 // this client's (Engine.Lease)
	// removed are the inodes this transaction deleted; kept, those whose
	// last link it removed while they are open here (orphans).
	removed, kept  []uint64
	made, madeDirs []uint64 // inodes it made (no xattrs but those it wrote), directories (no entries)
}

// load reads the inodes not read yet, in one request.
func (t *ntx) load(inos ...uint64) error {
	_, err := t.read(inos)
	return err
}

// read reads, in one request, the inodes of inos not read yet and keys,
// whose values it returns (nil: absent).
func (t *ntx) read(inos []uint64, keys ...string) ([][]byte, error) {
	all := append([]string(nil), keys...)
	var want []uint64
	for _, ino := range inos {
		if _, ok := t.inodes[ino]; !ok && !slices.Contains(want, ino) {
			all = append(all, t.fs.k.inode(ino))
			want = append(want, ino)
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	vals, err := t.tx.Get(all...)
	if err != nil {
		return nil, err
	}
	for i, v := range vals[len(keys):] {
		if v == nil {
			t.inodes[want[i]] = nil
			continue
		}
		in, err := decodeInode(v)
		if err != nil {
			return nil, err
		}
		t.inodes[want[i]] = in
	}
	return vals[:len(keys)], nil
}

// inode is inode ino, read if need be; ENOENT if there is none.
func (t *ntx) inode(ino uint64) (*Inode, error) {
	if err := t.load(ino); err != nil {
		return nil, err
	}
	if t.inodes[ino] == nil {
		return nil, syscall.ENOENT
	}
	return t.inodes[ino], nil
}

// dir is inode ino, which must be a directory.
func (t *ntx) dir(ino uint64) (*Inode, error) {
	in, err := t.inode(ino)
	if err != nil {
		return nil, err
	}
	if !in.isDir() {
		return nil, syscall.ENOTDIR
	}
	return in, nil
}

// dirents reads entries (directory, name pairs) and the inodes of inos
// in one request; a missing entry is nil.
func (t *ntx) dirents(inos []uint64, pairs ...any) ([]*Dirent, error) {
	var keys []string
	for i := 0; i < len(pairs); i += 2 {
		keys = append(keys, t.fs.k.dirent(pairs[i].(uint64), pairs[i+1].(string)))
	}
	vals, err := t.read(inos, keys...)
	if err != nil {
		return nil, err
	}
	out := make([]*Dirent, len(vals))
	for i, v := range vals {
		if v == nil {
			continue
		}
		out[i] = &Dirent{}
		if err := json.Unmarshal(v, out[i]); err != nil {
			return nil, fmt.Errorf("bad directory entry %s: %v", keys[i], err)
		}
	}
	return out, nil
}

// touch marks inode ino changed; times says which times become now
// ('m': mtime and ctime, 'c': ctime).
func (t *ntx) touch(ino uint64, times byte) {
	in := t.inodes[ino]
	switch times {
	case 'm':
		in.Mtime, in.Ctime = t.now, t.now
	case 'c':
		in.Ctime = t.now
	}
	t.dirty[ino] = true
}

// putEntry makes name in dir lead to ino; addEntry counts it too.
func (t *ntx) putEntry(dir uint64, name string, ino uint64, typ uint32) {
	t.tx.Put(t.fs.k.dirent(dir, name), mustJSON(Dirent{Ino: ino, Type: typ}))
}

func (t *ntx) addEntry(dir uint64, name string, ino uint64, typ uint32) {
	t.putEntry(dir, name, ino, typ)
	t.inodes[dir].Entries++
	t.touch(dir, 'm')
}

func (t *ntx) delEntry(dir uint64, name string) {
	t.tx.Delete(t.fs.k.dirent(dir, name))
	t.inodes[dir].Entries--
	t.touch(dir, 'm')
}

// unlinkInode drops one link of ino, and the inode with its extended
// attributes and blocks with the last one. A directory's last link is
// its entry in its parent (its "." is not counted here).
func (t *ntx) unlinkInode(ino uint64) {
	in := t.inodes[ino]
	if in.isDir() {
		in.Nlink = 0
	} else if in.Nlink > 0 {
		in.Nlink--
	}
	if in.Nlink > 0 {
		t.touch(ino, 'c')
		return
	}
	if !in.isDir() && t.fs.openFile(ino) != nil && t.lease != 0 {
		// Open here: it stays, with no links, until its last close here,
		// or until this client's lease ends (gc takes it then).
		t.touch(ino, 'c')
		t.tx.PutLeased(t.fs.k.orphan(ino), []byte{}, t.lease)
		t.kept = append(t.kept, ino)
		return
	}
	t.drop(ino)
}

// drop deletes inode ino with its extended attributes; its blocks go to
// the garbage record.
func (t *ntx) drop(ino uint64) {
	in := t.inodes[ino]
	for _, b := range in.Blocks {
		if b.ID != "" {
			t.freed = append(t.freed, b.ID)
		}
	}
	t.tx.Delete(t.fs.k.inode(ino))
	t.tx.DeletePrefix(t.fs.k.xattrs(ino))
	t.tx.Delete(t.fs.k.orphan(ino))
	delete(t.dirty, ino)
	t.inodes[ino] = nil
	t.removed = append(t.removed, ino)
}

// newInode adds a new inode to the transaction.
func (t *ntx) newInode(ino uint64, in *Inode) {
	in.Atime, in.Mtime, in.Ctime = t.now, t.now, t.now
	t.inodes[ino] = in
	t.made = append(t.made, ino)
	t.dirty[ino] = true
}

// commit writes the changed inodes and the garbage record.
func (t *ntx) commit() {
	for ino := range t.dirty {
		if in := t.inodes[ino]; in != nil {
			t.tx.Put(t.fs.k.inode(ino), mustJSON(in))
		}
	}
	if len(t.freed) > 0 {
		t.tx.Put(t.fs.k.garbage()+fmt.Sprintf("%019d-%08x", t.now, rand.Uint32()), mustJSON(Garbage{Time: t.now, IDs: t.freed}))
	}
}

// newMode masks the mode of new inode ino as a local file system does:
// with its directory's default ACL def (nil: none), which it inherits (a
// directory keeps it as its own default), else with the umask.
func (t *ntx) newMode(def []byte, ino uint64, in *Inode, umask uint32) {
	a, err := parseACL(def)
	if def == nil || err != nil {
		in.Mode &^= umask & 0o777 // none, or not one we can read
		return
	}
	a = a.inherit(in.Mode)
	in.Mode = in.Mode&^0o777 | a.mode()
	if !a.minimal() {
		t.tx.Put(t.fs.k.xattr(ino, aclAccess), a.bytes())
	}
	if in.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		t.tx.Put(t.fs.k.xattr(ino, aclDefault), def)
	}
}

// chmodACL keeps inode ino's access ACL, if it has one, in step with its
// new mode.
func (t *ntx) chmodACL(ino uint64, mode uint32) error {
	key := t.fs.k.xattr(ino, aclAccess)
	v, err := t.tx.Get(key)
	if err != nil || v[0] == nil {
		return err
	}
	a, err := parseACL(v[0])
	if err != nil {
		return nil
	}
	t.tx.Put(key, a.chmod(mode).bytes())
	return nil
}
