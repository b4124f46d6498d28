package export

import (
	"context"
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

// jtype is what a place of the journal tree is.
type jtype uint8

const (
	jRoot jtype = iota + 1
	jFile
	jStats
)

// statsName is the statistics file in the journal tree.
const statsName = "stats"

// jpos is a place in the journal tree.
type jpos struct {
	typ  jtype
	j    *jrnl  // jFile
	vers uint32 // jFile: journal.Sprite if the server follows its rules
}

// journalFid is a fid of the journal tree.
type journalFid struct {
	*fid
	jpos
	opened bool
	stats  []byte        // jStats, opened: what it read then
	stop   chan struct{} // closed when the fid goes, ending its reads
	once   sync.Once     // closes stop
}

// newJournalFid is a fid of the journal tree at at, with its stop channel made
// once: its clunk closes it without the fid's lock.
func (c *conn) newJournalFid(who layer.Caller, at jpos) *fid {
	f := c.newFid(who)
	f.is = &journalFid{fid: f, jpos: at, stop: make(chan struct{})}
	return f
}

// interrupt ends the journal reads on jf, which hold it in use.
func (jf *journalFid) interrupt() { jf.once.Do(func() { close(jf.stop) }) }

func (jf *journalFid) clunk(context.Context) syscall.Errno { return 0 }
func (jf *journalFid) free(context.Context)                {}

func (p jpos) qid() p9wire.Qid {
	switch p.typ {
	case jRoot:
		return p9wire.Qid{Type: p9wire.QTDir, Path: jpath(""), Vers: journal.FillsReaddir | journal.OrdersFids | journal.KeepsLocks}
	case jStats:
		return p9wire.Qid{Path: jpath(statsName)}
	}
	return p9wire.Qid{Path: jpath(p.j.name), Vers: p.vers}
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

// walk walks names in the journal tree.
func (jf *journalFid) walk(ctx context.Context, names []string) (*fid, []p9wire.Qid, syscall.Errno) {
	at := jpos{typ: jf.typ, j: jf.j, vers: jf.c.s.spriteVers()}
	var qids []p9wire.Qid
	for i, name := range names {
		switch {
		case name == ".":
		case name == "..":
			at = jpos{typ: jRoot}
		case at.typ != jRoot:
			if i == 0 {
				return nil, nil, syscall.ENOTDIR
			}
			return nil, qids, 0
		case name == statsName:
			at = jpos{typ: jStats}
		default:
			j := (*jrnl)(nil)
			if validUUID(name) {
				j = jf.c.s.ctl.find(name)
			}
			if j == nil {
				if i == 0 {
					return nil, nil, syscall.ENOENT
				}
				return nil, qids, 0
			}
			at = jpos{typ: jFile, j: j, vers: jf.c.s.spriteVers()}
		}
		qids = append(qids, at.qid())
	}
	return jf.c.newJournalFid(jf.who, at), qids, 0
}

// none is a place at no file: the journal tree answers Txattrwalk and
// Tstatfs as a synthetic directory does (no xattrs, the default
// statistics).
func (jf *journalFid) none() *place { return &place{fid: jf.fid} }

func (jf *journalFid) xattrwalk(ctx context.Context, name string) (*xattrFid, syscall.Errno) {
	return jf.none().xattrwalk(ctx, name)
}

func (jf *journalFid) statfs(ctx context.Context, m *p9wire.FidReq) (p9wire.Message, syscall.Errno) {
	return jf.none().statfs(ctx, m)
}

func (jf *journalFid) fsync(context.Context, *p9wire.Fsync) (p9wire.Message, syscall.Errno) {
	return nil, 0
}

func (jf *journalFid) getattr(ctx context.Context, m *p9wire.Getattr) (p9wire.Message, syscall.Errno) {
	r := &p9wire.Rattr{Valid: p9wire.GetattrBasic, Qid: jf.qid(),
		Attr: layer.Attr{Mode: syscall.S_IFREG | 0o600, Nlink: 1, Uid: jf.who.Uid, Gid: jf.who.Gid}}
	switch jf.typ {
	case jRoot:
		r.Attr = synthAttr
	case jStats:
		r.Attr.Mode = syscall.S_IFREG | 0o444
	}
	return r, 0
}

func (jf *journalFid) lopen(ctx context.Context, m *p9wire.Lopen) (p9wire.Message, syscall.Errno) {
	if jf.opened {
		return nil, syscall.EBADF
	}
	switch jf.typ {
	case jFile:
		if e := jf.c.s.ctl.attach(jf.c, jf.j); e != 0 {
			return nil, e
		}
		jf.c.s.fence(jf.c, jf.j)
	case jStats:
		jf.stats = jf.c.s.stats()
	}
	jf.opened = true
	return &p9wire.OpenReply{T: p9wire.Tlopen, Qid: jf.qid()}, 0
}

// lcreate makes the journal of a UUID and opens it: a client the
// controller did not know (or no more).
func (jf *journalFid) lcreate(ctx context.Context, m *p9wire.Lcreate) (p9wire.Message, syscall.Errno) {
	if jf.typ != jRoot || jf.opened {
		return nil, syscall.EBADF
	}
	if !validUUID(m.Name) {
		return nil, syscall.EINVAL
	}
	ctl := jf.c.s.ctl
	if cur := jf.c.journal.Load(); cur != nil && cur.name != m.Name {
		return nil, syscall.EBUSY // one journal per connection
	}
	j, e := ctl.create(m.Name, jf.c.peer.Principal)
	if e != 0 {
		return nil, e
	}
	if e := ctl.attach(jf.c, j); e != 0 {
		return nil, e
	}
	jf.jpos = jpos{typ: jFile, j: j, vers: jf.c.s.spriteVers()}
	jf.opened = true
	return &p9wire.OpenReply{T: p9wire.Tlcreate, Qid: jf.qid()}, 0
}

func (jf *journalFid) read(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno) {
	count := min(m.Count, jf.c.ioMax())
	switch {
	case !jf.opened:
		return nil, syscall.EBADF
	case jf.typ == jStats:
		return readAt(jf.stats, m.Offset, count), 0
	case jf.typ == jFile:
		// Waiting for records is not being busy (admit.go).
		jf.c.parked.Add(1)
		b, e := jf.j.read(ctx, jf.stop, jf.c.s.drain, m.Offset, int(count))
		jf.c.parked.Add(-1)
		if e != 0 {
			return nil, e
		}
		return &p9wire.DataReply{T: p9wire.Tread, Data: b}, 0
	}
	return nil, syscall.EISDIR
}

func (jf *journalFid) write(ctx context.Context, m *p9wire.Write) (p9wire.Message, syscall.Errno) {
	if !jf.opened || jf.typ != jFile {
		return nil, syscall.EBADF
	}
	if e := jf.apply(ctx, m.Data); e != 0 {
		return nil, e
	}
	return &p9wire.WriteReply{Count: uint32(len(m.Data))}, 0
}

// readdir lists the root: stats alone.
func (jf *journalFid) readdir(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno) {
	if !jf.opened || jf.typ != jRoot {
		return nil, syscall.EBADF
	}
	var b p9wire.Enc
	if m.Offset == 0 && direntSize(statsName) <= int(m.Count) {
		dirent(&b, jpos{typ: jStats}.qid(), 1, syscall.S_IFREG, statsName)
	}
	return &p9wire.DataReply{T: p9wire.Treaddir, Data: b.B}, 0
}

// apply applies a write of records from the client: Dropped (it no
// longer caches the QID), Sprite's Dirty and Clean (sprite.go), Held
// (sprite_held.go) and Returned (sprite_deleg.go). A
// write that is not all well-framed records of those kinds changes
// nothing and is EINVAL.
func (jf *journalFid) apply(ctx context.Context, data []byte) syscall.Errno {
	var recs []journal.Record
	for b := data; len(b) > 0; {
		r, rest, err := journal.Next(b)
		if err != nil || r.Kind != journal.Dropped && r.Kind != journal.Dirty && r.Kind != journal.Clean && r.Kind != journal.Held && r.Kind != journal.Returned {
			return syscall.EINVAL
		}
		recs = append(recs, r)
		b = rest
	}
	j, sp := jf.j, jf.c.s.sp
	var refused syscall.Errno
	for _, r := range recs {
		switch {
		case r.Kind == journal.Dropped:
			j.drop(jf.c.s.roots, r.Qid.Path)
		case r.Kind == journal.Held:
			sp.heldFrom(ctx, j, &r)
		case r.Kind == journal.Returned:
			sp.returned(j, r.Qid.Path, r.Seq)
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
			j.follows = r.Qid.Vers&journal.Follows != 0
			j.delegates = r.Qid.Vers&journal.Delegates != 0
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
	// A client reclaims one file a write, so it knows which was refused.
	return refused
}
