package wrap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
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
)

// hashName is prefix + base64url(SHA-256(b)): a long name's stand-in, a
// long target's sidecar.
func hashName(prefix string, b []byte) string {
	sum := sha256.Sum256(b)
	return prefix + base64.RawURLEncoding.EncodeToString(sum[:])
}

// id returns the directory's identity for the NameCodec.
func (n *node) id(ctx context.Context) ([]byte, layer.Errno) {
	if n.fs.dirs == nil {
		return nil, 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dirID == nil {
		id, e := n.fs.readDirID(ctx, n.Lower)
		if e != 0 {
			return nil, e
		}
		n.dirID = id
	}
	return n.dirID, 0
}

func (f *fs) readDirID(ctx context.Context, d layer.Node) ([]byte, layer.Errno) {
	id, e := readSmall(ctx, d, f.dirs.DirIDFile(), maxDirID)
	if e == syscall.EIO || e == 0 && len(id) == 0 {
		f.log.Error("wrap: a directory's identity file is damaged", "token", d.Token())
		return nil, syscall.EIO
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

// writeSmall makes file name in lower directory d hold data, durably.
func writeSmall(ctx context.Context, d layer.Node, name string, data []byte, flags uint32) layer.Errno {
	var a layer.Attr
	c, h, e := d.Create(ctx, name, syscall.O_WRONLY|flags, 0o444, &a)
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

// initDir writes the identity file of lower directory d: id, or a new one.
func (f *fs) initDir(ctx context.Context, d layer.Node, id []byte) layer.Errno {
	if id == nil {
		var err error
		if id, err = f.dirs.NewDirID(); err != nil {
			return syscall.EIO
		}
	}
	return writeSmall(ctx, d, f.dirs.DirIDFile(), id, syscall.O_EXCL)
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
// entries above, else its identity file is removed. finish must follow,
// telling whether the removal failed, so that the identity is put back.
// Without DirIDer there is nothing to do.
func (n *node) emptyDir(ctx context.Context, lname string) (finish func(failed bool), e layer.Errno) {
	noop := func(bool) {}
	if n.fs.dirs == nil {
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
	idFile := n.fs.dirs.DirIDFile()
	d, e := c.OpenDir(ctx)
	if e != 0 {
		c.Forget()
		return noop, e
	}
	for {
		ent, ok, e := d.Next(ctx)
		if e != 0 || !ok {
			d.Close()
			if e != 0 {
				c.Forget()
				return noop, e
			}
			break
		}
		if ent.Name != "." && ent.Name != ".." && ent.Name != idFile {
			d.Close()
			c.Forget()
			return noop, syscall.ENOTEMPTY
		}
	}
	id, e := n.fs.readDirID(ctx, c)
	if e == syscall.ENOENT {
		c.Forget()
		return noop, 0
	}
	if e == 0 {
		e = c.Unlink(ctx, idFile)
	}
	if e != 0 {
		c.Forget()
		return noop, e
	}
	return func(failed bool) {
		if failed {
			n.fs.initDir(ctx, c, id)
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
		enc = string(b)
	}
	id, e := n.id(ctx)
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

// writeSidecar records the encoded name behind a long stand-in name.
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
	return writeSmall(ctx, n.Lower, lname+sidecarSuffix, []byte(enc), syscall.O_TRUNC)
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
	if !n.fs.isLong(lname) {
		return
	}
	var a layer.Attr
	if c, e := n.Lower.Lookup(ctx, lname, &a); e == 0 {
		c.Forget()
		return
	}
	n.removeSidecar(ctx, lname)
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
	if e := writeSmall(ctx, f.lowerRoot, side, stored, syscall.O_EXCL); e != 0 {
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

// OpenDir lists the lower directory with names decoded.
func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
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
