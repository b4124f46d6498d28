package export

import (
	"context"
	"encoding/binary"
	"sync"
	"syscall"

	"github.com/cespare/xxhash/v2"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// The journal tree, attach name journal.Aname: a directory of one file
// per journal, named by its client's UUID, and the read-only file stats.
// Journals are not listed (a UUID is all it takes to read one); the
// directory lists only stats.

// jkind is what a fid of the journal tree is.
type jkind uint8

const (
	jRoot jkind = iota + 1
	jFile
	jStats
)

// statsName is the statistics file in the journal tree.
const statsName = "stats"

// jnode is a fid's place in the journal tree.
type jnode struct {
	kind  jkind
	j     *jrnl         // jFile
	stop  chan struct{} // closed when the fid goes, ending its reads
	once  sync.Once     // closes stop
	stats []byte        // jStats, opened: what it read then
	vers  uint32        // jFile: journal.Sprite if the server follows its rules
}

// newJnode is a fid's place in the journal tree, with its stop channel
// made once: its clunk closes it without the fid's lock.
func newJnode(kind jkind, j *jrnl) *jnode {
	return &jnode{kind: kind, j: j, stop: make(chan struct{})}
}

// stopReads ends the journal reads on f, which hold it in use: before
// anything that waits for f to be free (its clunk, its release).
func (f *file) stopReads() {
	if f.jt != nil {
		f.jt.once.Do(func() { close(f.jt.stop) })
	}
}

func (n *jnode) qid() p9wire.Qid {
	switch n.kind {
	case jRoot:
		return p9wire.Qid{Type: p9wire.QTDir, Path: jpath("")}
	case jStats:
		return p9wire.Qid{Path: jpath(statsName)}
	}
	return p9wire.Qid{Path: jpath(n.j.name), Vers: n.vers}
}

// jpath is a QID path of the journal tree: far from inode numbers and
// from synthQID's.
func jpath(name string) uint64 { return xxhash.Sum64String("\x01"+name) | 1<<63 }

// validUUID tells whether name is a UUID in canonical form: 36 characters,
// lower-case hex in groups of 8-4-4-4-12.
func validUUID(name string) bool {
	if len(name) != 36 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// jwalk walks names in the journal tree.
func (f *file) jwalk(names []string) (*file, []p9wire.Qid, syscall.Errno) {
	at := jnode{kind: f.jt.kind, j: f.jt.j, vers: f.c.s.spriteVers()}
	var qids []p9wire.Qid
	for i, name := range names {
		switch {
		case name == ".":
		case name == "..":
			at = jnode{kind: jRoot}
		case at.kind != jRoot:
			if i == 0 {
				return nil, nil, syscall.ENOTDIR
			}
			return nil, qids, 0
		case name == statsName:
			at = jnode{kind: jStats}
		default:
			j := (*jrnl)(nil)
			if validUUID(name) {
				j = f.c.s.ctl.find(name)
			}
			if j == nil {
				if i == 0 {
					return nil, nil, syscall.ENOENT
				}
				return nil, qids, 0
			}
			at = jnode{kind: jFile, j: j, vers: f.c.s.spriteVers()}
		}
		qids = append(qids, at.qid())
	}
	nj := newJnode(at.kind, at.j)
	nj.vers = at.vers
	return &file{c: f.c, seq: f.c.seq.Add(1), who: f.who, jt: nj}, qids, 0
}

// jop serves a request on a fid of the journal tree.
func (f *file) jop(ctx context.Context, typ uint8, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	n := f.jt
	switch typ {
	case p9wire.Tgetattr:
		d.U64()
		if d.Err != nil {
			return syscall.EINVAL
		}
		r := p9wire.Rattr{Valid: p9wire.GetattrBasic, Qid: n.qid(),
			Attr: layer.Attr{Mode: syscall.S_IFREG | 0o600, Nlink: 1, Uid: f.who.Uid, Gid: f.who.Gid}}
		switch n.kind {
		case jRoot:
			r.Attr = synthAttr
		case jStats:
			r.Attr.Mode = syscall.S_IFREG | 0o444
		}
		m.Getattr(&r)
		return 0
	case p9wire.Tlopen:
		d.U32()
		if d.Err != nil {
			return syscall.EINVAL
		}
		if f.opened {
			return syscall.EBADF
		}
		switch n.kind {
		case jFile:
			if e := f.c.s.ctl.attach(f.c, n.j); e != 0 {
				return e
			}
		case jStats:
			n.stats = f.c.s.stats()
		}
		f.opened = true
		m.Qid(n.qid())
		m.U32(0)
		return 0
	case p9wire.Tlcreate:
		return f.jcreate(d, m)
	case p9wire.Tread:
		off, count := d.U64(), d.U32()
		if d.Err != nil {
			return syscall.EINVAL
		}
		count = min(count, f.c.ioMax())
		switch {
		case !f.opened:
			return syscall.EBADF
		case n.kind == jStats:
			b := n.stats[min(off, uint64(len(n.stats))):]
			m.Bytes(b[:min(len(b), int(count))])
			return 0
		case n.kind == jFile:
			return n.j.read(ctx, n.stop, off, int(count), m)
		}
		return syscall.EISDIR
	case p9wire.Twrite:
		d.U64()
		data := d.Bytes()
		if d.Err != nil {
			return syscall.EINVAL
		}
		if !f.opened || n.kind != jFile {
			return syscall.EBADF
		}
		return f.jdropped(data, m)
	case p9wire.Treaddir:
		off, count := d.U64(), d.U32()
		if d.Err != nil {
			return syscall.EINVAL
		}
		if !f.opened || n.kind != jRoot {
			return syscall.EBADF
		}
		at := len(m.B)
		m.U32(0)
		if off == 0 && direntSize(statsName) <= int(count) {
			dirent(m, (&jnode{kind: jStats}).qid(), 1, syscall.S_IFREG, statsName)
		}
		binary.LittleEndian.PutUint32(m.B[at:], uint32(len(m.B)-at-4))
		return 0
	case p9wire.Tstatfs:
		return f.statfs(ctx, d, m)
	case p9wire.Tfsync:
		return 0
	}
	return syscall.EOPNOTSUPP
}

// jcreate makes the journal of a UUID and opens it: a client the
// controller did not know (or no more).
func (f *file) jcreate(d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name := d.Str()
	d.U32()
	d.U32()
	d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if f.jt.kind != jRoot || f.opened {
		return syscall.EBADF
	}
	if !validUUID(name) {
		return syscall.EINVAL
	}
	ctl := f.c.s.ctl
	if cur := f.c.journal.Load(); cur != nil && cur.name != name {
		return syscall.EBUSY // one journal per connection
	}
	j, e := ctl.create(name)
	if e != 0 {
		return e
	}
	if e := ctl.attach(f.c, j); e != 0 {
		return e
	}
	f.jt.kind, f.jt.j, f.jt.vers = jFile, j, f.c.s.spriteVers()
	f.opened = true
	m.Qid(f.jt.qid())
	m.U32(0)
	return 0
}

// jdropped applies a write of records from the client: Dropped (it no
// longer caches the QID), and Sprite's Dirty and Clean (sprite.go). A
// write that is not all well-framed records of those kinds changes
// nothing and is EINVAL.
func (f *file) jdropped(data []byte, m *p9wire.Enc) syscall.Errno {
	var recs []journal.Record
	for b := data; len(b) > 0; {
		r, rest, err := journal.Next(b)
		if err != nil || r.Kind != journal.Dropped && r.Kind != journal.Dirty && r.Kind != journal.Clean {
			return syscall.EINVAL
		}
		recs = append(recs, r)
		b = rest
	}
	j, sp := f.jt.j, f.c.s.sp
	var refused syscall.Errno
	for _, r := range recs {
		switch {
		case r.Kind == journal.Dropped:
			j.drop(f.c.s.roots, r.Qid.Path)
		case r.Kind == journal.Dirty:
			j.mu.Lock()
			j.sprite = true // only a client that follows the rules reclaims
			j.mu.Unlock()
			if e := sp.dirtyFrom(j, r.Qid.Path); e != 0 {
				refused = e
			}
		case r.Qid.Path == 0:
			j.mu.Lock()
			j.sprite = true // the hello
			j.mu.Unlock()
			switch r.Seq {
			case 0:
			case journal.Goodbye:
				sp.goodbye(j)
			default:
				sp.cleanAll(j, r.Seq)
			}
		case r.Seq == 0:
			sp.cleanUnasked(j, r.Qid.Path, r.Qid.Vers)
		default:
			sp.clean(j, r.Qid.Path, r.Seq)
		}
	}
	if refused != 0 {
		// A client reclaims one file a write, so it knows which.
		return refused
	}
	m.U32(uint32(len(data)))
	return 0
}
