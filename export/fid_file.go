package export

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// fileFid is a fid of a file or directory of a root, or of a synthetic
// directory above roots: what Tattach and Twalk make.
type fileFid struct {
	place

	// What Tlopen and Tlcreate set, while the fid is theirs alone.
	opened bool
	h      layer.Handle
	so     *spriteOpen // the open as Sprite's rules count it (sprite.go)
	d      layer.DirStream

	smu   sync.Mutex // the directory stream's position
	dpos  uint64     // offset the stream is at: the Off of the last entry sent
	pend  *layer.DirEntry
	dlost bool // the stream is past dpos: entries read were not sent

	omu    sync.Mutex // owners, which Tlocks add to at once
	owners []uint64   // lock owners that took locks through h
}

// free gives back the POSIX locks of the owners that locked through f,
// its handle or directory stream, and its nodes.
func (f *fileFid) free(ctx context.Context) {
	if f.h != nil {
		f.c.handles.Add(-1)
		for _, o := range f.owners {
			f.h.Flush(ctx, o)
		}
		f.h.Release(ctx)
	}
	if f.so != nil {
		f.c.s.sp.close(f.so, f.c)
	}
	if f.d != nil {
		f.d.Close()
	}
	f.place.free(ctx)
}

func (f *fileFid) getattr(ctx context.Context, m *p9wire.Getattr) (p9wire.Message, syscall.Errno) {
	return f.attr(ctx, f.h)
}

func (f *fileFid) setattr(ctx context.Context, m *p9wire.Setattr) (p9wire.Message, syscall.Errno) {
	return nil, f.setattrs(ctx, f.h, m)
}

// openFlags maps Tlopen's flags to this system's open(2) flags. Flags
// that make no sense for a server's descriptor (O_CLOEXEC, O_NOCTTY,
// O_ASYNC) or that would change how it must be used (O_DIRECT wants
// aligned buffers) are dropped, and so are O_CREAT and those about the
// path, which the walk has resolved.
func openFlags(w uint32) (uint32, syscall.Errno) {
	if w&syscall.O_ACCMODE == syscall.O_ACCMODE {
		return 0, syscall.EINVAL
	}
	const keep = unix.O_ACCMODE | unix.O_EXCL | unix.O_TRUNC | unix.O_APPEND | unix.O_NONBLOCK | unix.O_DSYNC | unix.O_NOATIME | unix.O_SYNC
	return p9wire.HostFlags(w) & keep, 0
}

func (f *fileFid) lopen(ctx context.Context, m *p9wire.Lopen) (p9wire.Message, syscall.Errno) {
	writeBack := m.Flags&journal.WriteBack != 0
	fl, e := openFlags(m.Flags &^ journal.WriteBack)
	if e != 0 {
		return nil, e
	}
	if f.opened {
		return nil, syscall.EBADF
	}
	q := f.qid()
	if f.rec != nil {
		// Only regular files and directories: opening a fifo would hang
		// the server, a device would be the server's, and clients (Linux
		// v9fs) serve special files themselves.
		n := f.rec.n
		switch f.mode {
		case syscall.S_IFDIR:
			if f.d, e = n.OpenDir(ctx); e != 0 {
				return nil, e
			}
		case syscall.S_IFREG:
			switch {
			case !f.c.s.opts.Sprite:
			case !writeBack:
				// What programs in LOWER did before this open reaches
				// the journals first, and so the opener's before its
				// open returns (sprite.open waits for that).
				f.c.s.st.Events().Sync()
				write := fl&unix.O_ACCMODE != unix.O_RDONLY || fl&unix.O_TRUNC != 0
				if q.Vers, e = f.spriteOpen(ctx, write, false); e != 0 {
					return nil, e
				}
			default:
				if e = f.c.s.sp.writeBack(interestKey{f.r, q.Path}, f.c); e != 0 {
					return nil, e
				}
			}
			if f.h, e = n.Open(ctx, fl); e != 0 {
				f.spriteClose()
				return nil, e
			}
		default:
			return nil, syscall.EINVAL
		}
	}
	if f.h != nil {
		f.c.handles.Add(1)
	}
	f.opened = true
	return &p9wire.OpenReply{T: p9wire.Tlopen, Qid: q}, 0
}

// spriteOpen counts an open of f's regular file under Sprite's rules
// and returns the QID version to answer with.
func (f *fileFid) spriteOpen(ctx context.Context, write, create bool) (uint32, syscall.Errno) {
	so := &spriteOpen{k: interestKey{f.r, f.qid().Path}, write: write}
	v, e := f.c.s.sp.open(ctx, so.k, f.c, so, write, create)
	if e == 0 {
		f.so = so
	}
	if write {
		// Its right to reclaim after a restart is on disk before the
		// client may delay a write.
		f.c.s.rights.Recorded()
	}
	return v, e
}

// spriteClose undoes spriteOpen, for an open that failed after it.
func (f *fileFid) spriteClose() {
	if f.so != nil {
		f.c.s.sp.close(f.so, f.c)
		f.so = nil
	}
}

// creating checks a Tlcreate in p: the flags it opens with, and the
// directory's node.
func (p *place) creating(m *p9wire.Lcreate) (layer.Node, uint32, syscall.Errno) {
	if badName(m.Name) {
		return nil, 0, syscall.EINVAL
	}
	fl, e := openFlags(m.Flags)
	if e != 0 {
		return nil, 0, e
	}
	n, e := p.node(syscall.EROFS)
	return n, fl, e
}

// lcreate makes a file in f's directory; f becomes the new file, open.
func (f *fileFid) lcreate(ctx context.Context, m *p9wire.Lcreate) (p9wire.Message, syscall.Errno) {
	n, fl, e := f.creating(m)
	if e != 0 {
		return nil, e
	}
	if f.opened {
		return nil, syscall.EBADF
	}
	var a layer.Attr
	cn, h, e := n.Create(f.createCtx(ctx, m.Gid), m.Name, fl|unix.O_CREAT, m.Mode&0o7777, &a)
	if e != 0 {
		return nil, e
	}
	f.up = append(f.up, f.pos)
	f.pos = pos{r: f.r, rec: f.c.hold(f.r, cn), mode: a.Mode & syscall.S_IFMT, name: m.Name}
	f.h, f.opened = h, true
	f.c.handles.Add(1)
	f.c.note(ctx, f.r, f.qid())
	q := f.qid()
	if f.c.s.opts.Sprite {
		if q.Vers, e = f.spriteOpen(ctx, true, true); e != 0 {
			return nil, e // the file is made and open: the client's clunk releases it
		}
	}
	return &p9wire.OpenReply{T: p9wire.Tlcreate, Qid: q}, 0
}

func (f *fileFid) read(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno) {
	count := min(m.Count, f.c.ioMax())
	if f.h == nil {
		return nil, syscall.EBADF
	}
	if m.Offset > math.MaxInt64-uint64(count) {
		return nil, syscall.EINVAL // as pread(2): the end would overflow
	}
	b := make([]byte, count)
	k, e := f.h.Read(ctx, b, int64(m.Offset))
	if e != 0 {
		return nil, e
	}
	return &p9wire.DataReply{T: p9wire.Tread, Data: b[:k]}, 0
}

func (f *fileFid) write(ctx context.Context, m *p9wire.Write) (p9wire.Message, syscall.Errno) {
	if f.h == nil {
		return nil, syscall.EBADF
	}
	if m.Offset > math.MaxInt64-uint64(len(m.Data)) {
		return nil, syscall.EINVAL // as pwrite(2): the end would overflow
	}
	if f.so != nil && f.so.revoked.Load() && f.c.s.sp.writtenElsewhere(f.so.k, f.c) {
		// Its client failed a recall of the file since this open, and
		// another opened it for writing since: what it writes now may be
		// what it held back, over the other's (evict.go).
		return nil, syscall.ESTALE
	}
	k, e := f.h.Write(ctx, m.Data, int64(m.Offset))
	if e != 0 {
		return nil, e
	}
	if f.so != nil {
		f.c.s.sp.changed(ctx, f.so.k, f.c)
	}
	if f.c.s.opts.Sprite {
		f.c.s.sp.progress(interestKey{f.r, f.qid().Path}, f.c)
	}
	return &p9wire.WriteReply{Count: uint32(k)}, 0
}

func (f *fileFid) fsync(ctx context.Context, m *p9wire.Fsync) (p9wire.Message, syscall.Errno) {
	switch {
	case f.h != nil:
		return nil, f.h.Fsync(ctx, m.Datasync)
	case f.d != nil:
		return nil, f.d.Fsync(ctx, m.Datasync)
	}
	return nil, 0
}

// direntSize is a dirent's size on the wire: qid[13] offset[8] type[1]
// name[s].
func direntSize(name string) int { return 13 + 8 + 1 + 2 + len(name) }

// dirent appends an entry to the data of an Rreaddir; its type is the
// d_type.
func dirent(b *p9wire.Enc, q p9wire.Qid, off uint64, mode uint32, name string) {
	b.Qid(q)
	b.U64(off)
	b.U8(uint8(mode >> 12))
	b.Str(name)
}

// readdir answers the entries after offset that fit in count bytes, so
// that the stream stops where the reply does. Entries' QIDs are made of
// DirEntry.Ino and Type, without a Lookup each: Ino is informational in
// the layers (a generally-named layer's tokens may differ), and clients
// take inode numbers from walks; a Lookup per entry would cost more than
// the listing.
func (f *fileFid) readdir(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno) {
	count := int(min(m.Count, f.c.ioMax()))
	var b p9wire.Enc
	if f.rec == nil {
		if !f.opened {
			return nil, syscall.EBADF
		}
		f.synthReaddir(m.Offset, count, &b)
	} else if e := f.streamReaddir(ctx, m.Offset, count, &b); e != 0 {
		return nil, e
	}
	return &p9wire.DataReply{T: p9wire.Treaddir, Data: b.B}, 0
}

func (f *fileFid) streamReaddir(ctx context.Context, offset uint64, count int, b *p9wire.Enc) syscall.Errno {
	if f.d == nil {
		return syscall.EBADF
	}
	f.smu.Lock()
	defer f.smu.Unlock()
	if offset != f.dpos || f.dlost {
		f.pend, f.dlost = nil, false
		if e := f.d.Seek(ctx, offset); e != 0 {
			return e
		}
		f.dpos = offset
	}
	start := len(b.B)
	for used := 0; ; {
		var ent layer.DirEntry
		if f.pend != nil {
			ent, f.pend = *f.pend, nil
		} else {
			var ok bool
			var e syscall.Errno
			ent, ok, e = f.d.Next(ctx)
			if e != 0 {
				if used > 0 {
					// A reply cut short by an error would say the listing
					// ended (journal.FillsReaddir): the error goes now, and
					// the entries read again after it.
					b.B, f.dlost = b.B[:start], true
				}
				return e
			}
			if !ok {
				return 0
			}
		}
		sz := direntSize(ent.Name)
		if used+sz > count {
			f.pend = &ent
			if used == 0 {
				return syscall.EINVAL // not even one entry fits
			}
			return 0
		}
		used += sz
		dirent(b, p9wire.Qid{Type: p9wire.QidType(ent.Type), Path: ent.Ino}, ent.Off, ent.Type, ent.Name)
		f.dpos = ent.Off
	}
}

// synthReaddir lists a synthetic directory: the next components of the
// root names below it, offsets counting entries.
func (f *fileFid) synthReaddir(offset uint64, count int, b *p9wire.Enc) {
	var names []string
	seen := map[string]bool{}
	for name := range f.c.s.roots {
		rest, ok := name, f.mnt == ""
		if !ok {
			rest, ok = strings.CutPrefix(name, f.mnt+"/")
		}
		if !ok || rest == "" {
			continue
		}
		first, _, _ := strings.Cut(rest, "/")
		if !seen[first] {
			seen[first] = true
			names = append(names, first)
		}
	}
	slices.Sort(names)
	used := 0
	for i := offset; i < uint64(len(names)); i++ {
		name := names[i]
		if used += direntSize(name); used > count {
			break
		}
		full := name
		if f.mnt != "" {
			full = f.mnt + "/" + name
		}
		q := synthQID(full)
		if r, ok := f.c.s.roots[full]; ok {
			q = p9wire.Qid{Type: p9wire.QTDir, Path: r.n.Token().Ino}
		}
		dirent(b, q, i+1, syscall.S_IFDIR, name)
	}
}

// lockOwner is the layers' lock owner of a 9P client's process: the
// connection, the client's name (Linux sends its node name) and its pid.
func (f *fileFid) lockOwner(pid uint32, client string) uint64 {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], f.c.id)
	binary.LittleEndian.PutUint32(b[8:], pid)
	h := xxhash.New()
	h.Write(b[:])
	h.WriteString(client)
	return h.Sum64()
}

// wireLock is a Tlock's or Tgetlock's range and type as a layer.Lock, on
// f's open file.
func (f *fileFid) wireLock(typ uint8, start, length uint64, pid uint32) (layer.Lock, syscall.Errno) {
	lk := layer.Lock{Start: start, End: math.MaxUint64, Pid: pid}
	if f.h == nil {
		return lk, syscall.EBADF
	}
	if length != 0 {
		if length-1 > math.MaxUint64-start {
			return lk, syscall.EINVAL
		}
		lk.End = start + length - 1
	}
	switch typ {
	case p9wire.LockRead:
		lk.Type = syscall.F_RDLCK
	case p9wire.LockWrite:
		lk.Type = syscall.F_WRLCK
	case p9wire.LockUnlock:
		lk.Type = syscall.F_UNLCK
	default:
		return lk, syscall.EINVAL
	}
	return lk, 0
}

// lock sets or clears a POSIX lock. It never waits: a conflicting request
// is answered Blocked, which Linux's client retries while the process
// waits (F_SETLKW) or turns into EAGAIN (F_SETLK).
func (f *fileFid) lock(ctx context.Context, m *p9wire.Lock) (p9wire.Message, syscall.Errno) {
	lk, e := f.wireLock(m.LockType, m.Start, m.Length, m.ProcID)
	if e != 0 {
		return nil, e
	}
	owner := f.lockOwner(m.ProcID, m.ClientID)
	if lk.Type != syscall.F_UNLCK {
		f.c.s.sp.locking(ctx, f.so, f.c, m.LockType, true)
	}
	switch e := f.h.Setlk(ctx, owner, &lk, false); e {
	case 0:
	case syscall.EAGAIN:
		return &p9wire.LockReply{Status: p9wire.LockBlocked}, 0
	default:
		return nil, e
	}
	if lk.Type != syscall.F_UNLCK {
		f.omu.Lock()
		if !slices.Contains(f.owners, owner) {
			f.owners = append(f.owners, owner)
		}
		f.omu.Unlock()
	}
	return &p9wire.LockReply{Status: p9wire.LockSuccess}, 0
}

// getlock answers the first lock that would conflict with the one asked,
// or the one asked as an unlock when none does (F_GETLK).
func (f *fileFid) getlock(ctx context.Context, m *p9wire.Getlock) (p9wire.Message, syscall.Errno) {
	lk, e := f.wireLock(m.LockType, m.Start, m.Length, m.ProcID)
	if e != 0 {
		return nil, e
	}
	f.c.s.sp.locking(ctx, f.so, f.c, m.LockType, false)
	if e := f.h.Getlk(ctx, f.lockOwner(m.ProcID, m.ClientID), &lk); e != 0 {
		return nil, e
	}
	r := &p9wire.Getlock{R: true, Start: lk.Start, ProcID: lk.Pid}
	switch lk.Type {
	case syscall.F_UNLCK:
		r.LockType, r.ClientID = p9wire.LockUnlock, m.ClientID
	case syscall.F_RDLCK:
		r.LockType = p9wire.LockRead
	default:
		r.LockType = p9wire.LockWrite
	}
	if lk.End != math.MaxUint64 {
		r.Length = lk.End - lk.Start + 1
	}
	return r, 0
}
