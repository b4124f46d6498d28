package wrap

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Names longer than the lower file system allows are stored under a short
// stand-in name, longPrefix + a hash of the encoded name, and the encoded
// name itself goes into a sidecar file, the stand-in + sidecarSuffix.
// Symlink targets too long once encoded are kept alike (see putLink).
const (
	maxDirID       = 64   // bytes of a directory identity file
	maxSidecar     = 4096 // bytes of a long name's sidecar
	nameMax        = 255
	longPrefix     = ".shale.L."
	sidecarSuffix  = ".name"
	linkMax        = 4095     // PATH_MAX-1: the longest symlink target
	maxLinkSidecar = 16 << 10 // bytes of a long target's sidecar
	linkPrefix     = ".shale.T."
	tmpPrefix      = ".shale.tmp." // a layer file or directory being made (putSmall, mkdirWithID)
)

// Crash safety. A layer file is never rewritten in place: it is written
// whole under a temporary name and renamed into place (putSmall), and a
// directory is made under a temporary name with its identity file in it,
// then renamed (mkdirWithID). What a crash can still leave is of two kinds,
// hidden like every name starting with ".shale.", and removed when a
// listing or an emptiness check meets them (tidyUp, clearLeftovers):
//
//   - temporaries of an instance of the layer that is gone: each instance
//     names its own with a random tag (tempName), so those of another tag
//     are stale. This holds while one process serves a lower directory;
//   - orphan sidecars: a sidecar comes before its stand-in and goes after
//     it, so a crash in between leaves it alone. While a long name is
//     being made its sidecar is not an orphan yet (makingLong).
//
// And an empty directory whose identity file is missing or damaged (an
// rmdir cut short between the two, or a crash of an older version) gets a
// new identity when it is used (repairDirID); nothing in it was named
// under the old one.

// hashName is prefix + base64url(SHA-256(b)): a long name's stand-in, a
// long target's sidecar.
func hashName(prefix string, b []byte) string {
	sum := sha256.Sum256(b)
	return prefix + base64.RawURLEncoding.EncodeToString(sum[:])
}

// newTag names one instance's temporaries.
func newTag() string {
	b := make([]byte, 9)
	rand.Read(b) // never fails (crypto/rand panics on a broken kernel)
	return base64.RawURLEncoding.EncodeToString(b)
}

// tempName gives a name for a temporary no other is using.
func (f *fs) tempName() string {
	return tmpPrefix + f.tag + "." + strconv.FormatUint(f.seq.Add(1), 36)
}

// isStaleTemp tells a temporary of another instance of the layer.
func (f *fs) isStaleTemp(lname string) bool {
	return f.names != nil && strings.HasPrefix(lname, tmpPrefix) && !strings.HasPrefix(lname, tmpPrefix+f.tag+".")
}

// isSidecar tells a long name's sidecar.
func (f *fs) isSidecar(lname string) bool {
	return f.names != nil && strings.HasPrefix(lname, longPrefix) && strings.HasSuffix(lname, sidecarSuffix)
}

// pendingName is a long name being made: its stand-in in a lower directory.
type pendingName struct {
	dir     layer.Token
	standIn string
}

// makingLong marks long name lname of directory n as being made until done
// is called, from before its sidecar is written until its stand-in exists.
func (n *node) makingLong(lname string) (done func()) {
	if !n.fs.isLong(lname) {
		return func() {}
	}
	f, k := n.fs, pendingName{n.Lower.Token(), lname}
	f.tidy.Lock()
	f.pending[k]++
	f.tidy.Unlock()
	return func() {
		f.tidy.Lock()
		if f.pending[k]--; f.pending[k] == 0 {
			delete(f.pending, k)
		}
		f.tidy.Unlock()
	}
}

// tidyUp removes lname from lower directory d if it is a leftover of a
// crash, and tells whether it was one (then it is not to be listed).
func (f *fs) tidyUp(ctx context.Context, d layer.Node, lname string) bool {
	if !f.isStaleTemp(lname) && !f.isSidecar(lname) {
		return false
	}
	// Most sidecars have their stand-in: tell without the lock.
	if f.isSidecar(lname) && exists(ctx, d, strings.TrimSuffix(lname, sidecarSuffix)) {
		return false
	}
	ctx, flush := layer.Defer(ctx) // events go out after the lock
	defer flush()
	f.tidy.Lock()
	defer f.tidy.Unlock()
	return f.removeLeftover(ctx, d, lname)
}

// removeLeftover removes stale temporary or orphan sidecar lname from lower
// directory d, unless the sidecar's name is being made or has its stand-in
// by now; it tells whether lname is gone. f.tidy is held.
func (f *fs) removeLeftover(ctx context.Context, d layer.Node, lname string) bool {
	if f.isSidecar(lname) {
		standIn := strings.TrimSuffix(lname, sidecarSuffix)
		if f.pending[pendingName{d.Token(), standIn}] > 0 || exists(ctx, d, standIn) {
			return false
		}
		e := d.Unlink(ctx, lname)
		return e == 0 || e == syscall.ENOENT
	}
	var a layer.Attr
	c, e := d.Lookup(ctx, lname, &a)
	if e != 0 {
		return e == syscall.ENOENT
	}
	if a.IsDir() {
		// A directory being made holds at most its identity file.
		if f.dirs != nil {
			c.Unlink(ctx, f.dirs.DirIDFile())
		}
		c.Forget()
		e = d.Rmdir(ctx, lname)
	} else {
		c.Forget()
		e = d.Unlink(ctx, lname)
	}
	return e == 0 || e == syscall.ENOENT
}

// clearLeftovers readies lower directory d for removal: ENOTEMPTY if it
// holds an entry or a long name being made; else the leftovers of crashes
// in it are removed. Its identity file is left to the caller.
func (f *fs) clearLeftovers(ctx context.Context, d layer.Node) layer.Errno {
	ctx, flush := layer.Defer(ctx)
	defer flush()
	f.tidy.Lock()
	defer f.tidy.Unlock()
	left, e := f.leftovers(ctx, d)
	if e != 0 {
		return e
	}
	for _, l := range left {
		if !f.removeLeftover(ctx, d, l) {
			return syscall.ENOTEMPTY
		}
	}
	return 0
}

// leftovers lists lower directory d: ENOTEMPTY if it holds an entry, or
// the sidecar of a long name being made; else the leftovers of crashes
// in it (an entry's sidecar makes no directory empty: its stand-in is an
// entry). f.tidy is held.
func (f *fs) leftovers(ctx context.Context, d layer.Node) ([]string, layer.Errno) {
	s, e := d.OpenDir(ctx)
	if e != 0 {
		return nil, e
	}
	defer s.Close()
	var left []string
	for {
		ent, ok, e := s.Next(ctx)
		if e != 0 || !ok {
			return left, e
		}
		switch l := ent.Name; {
		case l == "." || l == ".." || f.dirs != nil && l == f.dirs.DirIDFile():
		case f.isStaleTemp(l) ||
			f.isSidecar(l) && f.pending[pendingName{d.Token(), strings.TrimSuffix(l, sidecarSuffix)}] == 0:
			left = append(left, l)
		default:
			return nil, syscall.ENOTEMPTY
		}
	}
}

// exists tells whether lower directory d has an entry lname.
func exists(ctx context.Context, d layer.Node, lname string) bool {
	var a layer.Attr
	c, e := d.Lookup(ctx, lname, &a)
	if e == 0 {
		c.Forget()
	}
	return e == 0
}

// id returns the directory's identity for the NameCodec; one a crash lost
// is made anew where that is safe (repairDirID), except in the root.
func (n *node) id(ctx context.Context) ([]byte, layer.Errno) {
	return n.loadID(ctx, !n.root)
}

// loadID returns the directory's identity, the one remembered or read
// (and repaired if asked).
func (n *node) loadID(ctx context.Context, repair bool) ([]byte, layer.Errno) {
	if n.fs.dirs == nil {
		return nil, 0
	}
	n.mu.Lock()
	id := n.dirID
	n.mu.Unlock()
	if id != nil {
		return id, 0
	}
	id, e := n.fs.readDirID(ctx, n.Lower)
	if repair && (e == syscall.ENOENT || e == syscall.EIO) {
		id, e = n.fs.repairDirID(ctx, n.Lower)
	}
	if e != 0 {
		return nil, e
	}
	n.mu.Lock()
	n.dirID = id
	n.mu.Unlock()
	return id, 0
}

// readDirID reads the identity of lower directory d: ENOENT if it has no
// identity file, EIO if it is damaged (of the wrong length, unreadable).
func (f *fs) readDirID(ctx context.Context, d layer.Node) ([]byte, layer.Errno) {
	// As the layer: a caller may list a directory it may not search
	// (mode 0600), which needs the identity, but not look inside it.
	id, e := readSmall(layer.AsSelf(ctx), d, f.dirs.DirIDFile(), maxDirID)
	if e == 0 && len(id) != f.dirs.DirIDSize() {
		if len(id) > 0 { // empty: an older version's crash, repaired quietly
			f.log.Error("wrap: a directory's identity file has the wrong length", "token", d.Token(), "len", len(id), "want", f.dirs.DirIDSize())
		}
		return nil, syscall.EIO
	}
	return id, e
}

// repairDirID gives lower directory d, whose identity file is missing or
// damaged, a new identity if it is empty: nothing in it was named under
// the old one. One that holds entries fails with EIO: they cannot be
// decoded without the old identity, and a new one would hide them for
// good.
func (f *fs) repairDirID(ctx context.Context, d layer.Node) ([]byte, layer.Errno) {
	ctx, flush := layer.Defer(ctx)
	defer flush()
	f.tidy.Lock()
	defer f.tidy.Unlock()
	// Another request may have repaired it meanwhile.
	id, e := f.readDirID(ctx, d)
	if e != syscall.ENOENT && e != syscall.EIO {
		return id, e
	}
	if _, le := f.leftovers(ctx, d); le != 0 {
		if le == syscall.ENOTEMPTY {
			f.log.Error("wrap: a directory's identity file is missing or damaged, and it holds entries: their names cannot be decoded", "token", d.Token(), "errno", e)
			return nil, syscall.EIO
		}
		return nil, le
	}
	if id, e = f.newDirID(); e == 0 {
		e = f.putDirID(ctx, d, id, 0) // replacing a damaged one
	}
	return id, e
}

// readSmall reads the whole of file name in lower directory d, which must
// hold at most max bytes (EIO otherwise).
func readSmall(ctx context.Context, d layer.Node, name string, max uint64) ([]byte, layer.Errno) {
	var a layer.Attr
	c, e := d.Lookup(ctx, name, &a)
	if e != 0 {
		return nil, e
	}
	defer c.Forget()
	if a.Size > max {
		return nil, syscall.EIO
	}
	h, e := c.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		return nil, e
	}
	defer h.Release(ctx)
	b := make([]byte, a.Size)
	if k, e := h.Read(ctx, b, 0); e != 0 || k != len(b) {
		return nil, orEIO(e)
	}
	return b, 0
}

// writeSmall makes the new file name in lower directory d hold data,
// durably.
func writeSmall(ctx context.Context, d layer.Node, name string, data []byte) layer.Errno {
	var a layer.Attr
	c, h, e := d.Create(ctx, name, syscall.O_WRONLY|syscall.O_EXCL, 0o444, &a)
	if e != 0 {
		return e
	}
	defer c.Forget()
	defer h.Release(ctx)
	if k, e := h.Write(ctx, data, 0); e != 0 || k != len(data) {
		return orEIO(e)
	}
	return h.Fsync(ctx, false)
}

// putSmall makes file name in lower directory d hold data, durably and at
// once: data goes whole into a temporary, which is then renamed into place
// (flags as for rename(2)). A crash leaves at most the temporary.
func (f *fs) putSmall(ctx context.Context, d layer.Node, name string, data []byte, flags uint32) layer.Errno {
	tmp := f.tempName()
	e := writeSmall(ctx, d, tmp, data)
	if e == 0 {
		e = d.Rename(ctx, tmp, d, name, flags)
	}
	if e != 0 {
		d.Unlink(ctx, tmp)
	}
	return e
}

// newDirID makes an identity for a directory.
func (f *fs) newDirID() ([]byte, layer.Errno) {
	id, err := f.dirs.NewDirID()
	if err != nil {
		return nil, syscall.EIO
	}
	return id, 0
}

// putDirID gives lower directory d identity id (putSmall, with flags).
func (f *fs) putDirID(ctx context.Context, d layer.Node, id []byte, flags uint32) layer.Errno {
	return f.putSmall(ctx, d, f.dirs.DirIDFile(), id, flags)
}

// mkdirWithID makes lower directory lname with its identity file, under a
// temporary name first, so that no crash leaves it without one (the
// identity is written straight in: no one sees it before the rename);
// RENAME_NOREPLACE keeps mkdir's EEXIST.
func (n *node) mkdirWithID(ctx context.Context, lname string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	id, e := n.fs.newDirID()
	if e != 0 {
		return nil, e
	}
	tmp := n.fs.tempName()
	c, e := n.Lower.Mkdir(ctx, tmp, mode, out)
	if e != 0 {
		return nil, e
	}
	if e = writeSmall(ctx, c, n.fs.dirs.DirIDFile(), id); e == 0 {
		e = n.Lower.Rename(ctx, tmp, n.Lower, lname, unixRenameNoReplace)
	}
	if e != 0 {
		c.Unlink(ctx, n.fs.dirs.DirIDFile())
		c.Forget()
		n.Lower.Rmdir(ctx, tmp)
		return nil, e
	}
	return c, c.Getattr(ctx, nil, out) // the identity file and the rename changed it
}

// rmdir removes lower directory lname, whose identity file alone would
// keep it from being empty; if it cannot go, the identity is put back.
func (n *node) rmdir(ctx context.Context, lname string) layer.Errno {
	finish, e := n.emptyDir(ctx, lname)
	if e != 0 {
		return e
	}
	e = n.Lower.Rmdir(ctx, lname)
	finish(e != 0)
	return e
}

// emptyDir readies lower directory lname for removal: ENOTEMPTY if it has
// entries above, else the leftovers of crashes in it and its identity file
// are removed. finish must follow, telling whether the removal failed, so
// that the identity is put back (a damaged one is not: the directory is
// empty, and gets a new one if it is used).
func (n *node) emptyDir(ctx context.Context, lname string) (finish func(failed bool), e layer.Errno) {
	noop := func(bool) {}
	if n.fs.names == nil {
		return noop, 0
	}
	var a layer.Attr
	c, e := n.Lower.Lookup(ctx, lname, &a)
	if e != 0 {
		return noop, e
	}
	if !a.IsDir() {
		c.Forget()
		return noop, syscall.ENOTDIR
	}
	// What the layer keeps inside goes as the layer: the caller may
	// remove a directory it may not write in (one of another owner, in
	// a sticky directory of its own); the removal itself is the check.
	self := layer.AsSelf(ctx)
	if e := n.fs.clearLeftovers(self, c); e != 0 || n.fs.dirs == nil {
		c.Forget()
		return noop, e
	}
	id, e := n.fs.readDirID(ctx, c)
	switch e {
	case syscall.ENOENT:
		c.Forget()
		return noop, 0
	case 0, syscall.EIO:
		e = c.Unlink(self, n.fs.dirs.DirIDFile())
	}
	if e != 0 {
		c.Forget()
		return noop, e
	}
	return func(failed bool) {
		if failed && id != nil {
			n.fs.putDirID(self, c, id, unixRenameNoReplace)
		}
		c.Forget()
	}, 0
}

// encodeName gives the lower name of name in directory n.
func (n *node) encodeName(ctx context.Context, name string) (string, layer.Errno) {
	if n.fs.names == nil {
		return name, 0
	}
	id, e := n.id(ctx)
	if e != 0 {
		return "", e
	}
	enc, err := n.fs.names.EncodeName(id, name)
	if err != nil {
		return "", errnoOf(err, syscall.EINVAL)
	}
	if len(enc) > nameMax {
		return hashName(longPrefix, []byte(enc)), 0
	}
	return enc, 0
}

// isLong tells a stand-in for a long name; only a layer that encodes
// names makes them (a lower layer's stand-ins are just names here).
func (f *fs) isLong(lname string) bool {
	return f.names != nil && strings.HasPrefix(lname, longPrefix) && !strings.HasSuffix(lname, sidecarSuffix)
}

// decodeName gives the name above of lower name lname, or ok=false for
// names that are not to be shown.
func (n *node) decodeName(ctx context.Context, lname string) (string, bool) {
	if n.fs.names == nil {
		return lname, true
	}
	if lname == "." || lname == ".." {
		return lname, true
	}
	enc := lname
	if n.fs.isLong(lname) {
		b, e := n.readSidecar(ctx, lname)
		if e != 0 {
			return "", false
		}
		// A sidecar swapped for another's, or copied beside a second
		// stand-in, would list a name twice or under the wrong entry.
		if hashName(longPrefix, b) != lname {
			n.fs.log.Error("wrap: a long name's sidecar does not match its stand-in", "token", n.Lower.Token(), "name", lname)
			return "", false
		}
		enc = string(b)
	}
	// Never a repair here: UpperName runs while a raiser may hold locks.
	id, e := n.loadID(ctx, false)
	if e != 0 {
		return "", false
	}
	name, err := n.fs.names.DecodeName(id, enc)
	return name, err == nil
}

// UpperName maps a name an event from the bottom of the stack carries, in
// this directory's namespace below the layers beneath, to this layer's.
func (n *node) UpperName(ctx context.Context, hostName string) (string, bool) {
	name := hostName
	if t, ok := n.Lower.(layer.NameTranslator); ok {
		var ok bool
		if name, ok = t.UpperName(ctx, hostName); !ok {
			return "", false
		}
	}
	return n.decodeName(ctx, name)
}

// writeSidecar records the encoded name behind a long stand-in name. A
// sidecar that holds it already is left alone (it is always the same
// bytes); another one, damaged, is replaced at once.
func (n *node) writeSidecar(ctx context.Context, lname, name string) layer.Errno {
	if !n.fs.isLong(lname) {
		return 0
	}
	id, e := n.id(ctx)
	if e != 0 {
		return e
	}
	enc, err := n.fs.names.EncodeName(id, name)
	if err != nil {
		return errnoOf(err, syscall.EINVAL)
	}
	if b, e := n.readSidecar(ctx, lname); e == 0 && string(b) == enc {
		return 0
	}
	return n.fs.putSmall(ctx, n.Lower, lname+sidecarSuffix, []byte(enc), 0)
}

func (n *node) readSidecar(ctx context.Context, lname string) ([]byte, layer.Errno) {
	return readSmall(ctx, n.Lower, lname+sidecarSuffix, maxSidecar)
}

func (n *node) removeSidecar(ctx context.Context, lname string) {
	if n.fs.isLong(lname) {
		n.Lower.Unlink(ctx, lname+sidecarSuffix)
	}
}

// dropSidecar removes the sidecar of lname if no file has that name.
func (n *node) dropSidecar(ctx context.Context, lname string) {
	if n.fs.isLong(lname) && !exists(ctx, n.Lower, lname) {
		n.removeSidecar(ctx, lname)
	}
}

// A stored target longer than a lower symlink takes goes, like a long
// name, into a sidecar: in the root directory, named hashName(linkPrefix,
// stored). The lower symlink holds that name, padded with '/' to linkMax
// bytes. Named by content, the sidecar needs nothing when the symlink is
// renamed or linked, and one swapped for another fails the hash; the
// symlink's last link takes it along. Padded, every stand-in has the one
// length linkMax: LinkSize tells the size of any other link from its
// length, and stat reads only links of that length (a stand-in's size is
// its sidecar's).

// putLink gives the lower target for stored, and the sidecar it wrote
// ("" if stored fits a symlink).
func (f *fs) putLink(ctx context.Context, stored []byte) (target []byte, side string, e layer.Errno) {
	if len(stored) <= linkMax {
		return stored, "", 0
	}
	if len(stored) > maxLinkSidecar {
		return nil, "", syscall.ENAMETOOLONG
	}
	side = hashName(linkPrefix, stored)
	// Stored forms never repeat (LinkCodec): a sidecar already there is
	// another link's.
	if e := writeSmall(ctx, f.lowerRoot, side, stored); e != 0 {
		return nil, "", e
	}
	return linkStandIn(side), side, 0
}

func linkStandIn(side string) []byte {
	return []byte(side + strings.Repeat("/", linkMax-len(side)))
}

// linkSidecar gives the sidecar lower target t stands in for, if it is a
// stand-in.
func linkSidecar(t []byte) (string, bool) {
	if len(t) != linkMax || !bytes.HasPrefix(t, []byte(linkPrefix)) {
		return "", false
	}
	side, _, _ := bytes.Cut(t, []byte("/"))
	return string(side), true
}

// getLink gives the stored target behind lower target t: t, or the
// content of its sidecar, which must hash to the stand-in.
func (f *fs) getLink(ctx context.Context, t []byte) ([]byte, layer.Errno) {
	side, ok := linkSidecar(t)
	if !ok {
		return t, 0
	}
	stored, e := readSmall(ctx, f.lowerRoot, side, maxLinkSidecar)
	if e != 0 {
		return nil, e
	}
	if !bytes.Equal(linkStandIn(hashName(linkPrefix, stored)), t) {
		return nil, syscall.EIO
	}
	return stored, 0
}

// linkSize is the size above of symlink n, whose lower target is l bytes
// long. Sizes learnt by reading the link are remembered by token (a
// symlink's target never changes): a read at every stat would touch the
// link's access time, undoing times set with utimensat.
func (n *node) linkSize(ctx context.Context, l uint64) uint64 {
	if l != linkMax {
		return n.fs.links.LinkSize(l)
	}
	tok := n.Lower.Token()
	if s, ok := n.fs.linkSizes.Load(tok); ok {
		return s.(uint64)
	}
	t, e := n.Lower.Readlink(ctx)
	if e != 0 {
		return n.fs.links.LinkSize(l)
	}
	if side, ok := linkSidecar(t); ok {
		var a layer.Attr
		c, e := n.fs.lowerRoot.Lookup(ctx, side, &a)
		if e != 0 {
			return n.fs.links.LinkSize(l) // readlink will fail
		}
		c.Forget()
		l = a.Size
	}
	s := n.fs.links.LinkSize(l)
	n.fs.linkSizes.Store(tok, s)
	return s
}

// dropLink readies the removal of lower entry lname: if it is the last
// link of a symlink whose size linkSize may remember, finish (told whether
// the removal failed) forgets the size and removes the sidecar.
func (n *node) dropLink(ctx context.Context, lname string) (finish func(failed bool)) {
	noop := func(bool) {}
	if n.fs.links == nil {
		return noop
	}
	var a layer.Attr
	c, e := n.Lower.Lookup(ctx, lname, &a)
	if e != 0 {
		return noop
	}
	defer c.Forget()
	if a.Mode&syscall.S_IFMT != syscall.S_IFLNK || a.Size != linkMax || a.Nlink != 1 {
		return noop
	}
	tok := c.Token()
	t, _ := c.Readlink(ctx)
	side, long := linkSidecar(t)
	return func(failed bool) {
		if failed {
			return
		}
		n.fs.linkSizes.Delete(tok)
		if long {
			n.fs.lowerRoot.Unlink(ctx, side)
		}
	}
}

// OpenDir lists the lower directory with names decoded, and the
// leftovers of crashes it meets removed.
func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	// The identity first: one a crash lost is given back to an empty
	// directory here, and one with entries fails (id).
	if _, e := n.id(ctx); e != 0 {
		return nil, e
	}
	d, e := n.Lower.OpenDir(ctx)
	if e != 0 || n.fs.names == nil {
		return d, e
	}
	return &dir{n: n, lower: d}, 0
}

type dir struct {
	n     *node
	lower layer.DirStream
}

func (d *dir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	for {
		e, ok, errno := d.lower.Next(ctx)
		if !ok || errno != 0 {
			return e, ok, errno
		}
		if d.n.fs.tidyUp(ctx, d.n.Lower, e.Name) {
			continue
		}
		if name, show := d.n.decodeName(ctx, e.Name); show {
			e.Name = name
			return e, true, 0
		}
	}
}

func (d *dir) Seek(ctx context.Context, off uint64) layer.Errno { return d.lower.Seek(ctx, off) }

func (d *dir) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return d.lower.Fsync(ctx, datasync)
}

func (d *dir) Close() { d.lower.Close() }
