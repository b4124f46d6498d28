package export

import (
	"context"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// maxXattr bounds xattr values and lists: Linux's XATTR_SIZE_MAX.
const maxXattr = 64 << 10

// xattrFid is an extended attribute's value, or the list of a file's
// names of them: what Txattrwalk makes, to be read, and what Txattrcreate
// makes of a fid, to be written and set at its clunk. Its other requests
// are served as by a fid of its file that is not open (its place).
type xattrFid struct {
	place
	val []byte    // a Txattrwalk's value or name list
	set *xattrSet // what Txattrcreate gathers

	smu sync.Mutex // set's value, which Twrites fill
}

// xattrSet is a value being set: Twrites fill it, Tclunk sets it.
type xattrSet struct {
	name  string
	flags uint32
	val   []byte
}

// xattrwalk makes a fid of the value of p's xattr name, or of its list
// of names for "".
func (p *place) xattrwalk(ctx context.Context, name string) (*xattrFid, syscall.Errno) {
	n, e := p.node(syscall.ENODATA)
	if name == "" && e != 0 {
		n, e = nil, 0 // a synthetic directory has no xattrs
	}
	if e != 0 {
		return nil, e
	}
	val := []byte{}
	if n != nil {
		get := func(dest []byte) (int, syscall.Errno) { return n.Getxattr(ctx, name, dest) }
		if name == "" {
			get = func(dest []byte) (int, syscall.Errno) { return n.Listxattr(ctx, dest) }
		}
		if val, e = sized(get); e != 0 {
			return nil, e
		}
	}
	nf := p.c.newFid(p.who)
	x := &xattrFid{place: place{fid: nf, pos: p.pos}, val: val}
	nf.is = x
	p.c.ref(x.pos)
	return x, 0
}

// sized calls get, which works like getxattr(2), first for the size, then
// for the bytes; a value that grows in between is asked for again.
func sized(get func(dest []byte) (int, syscall.Errno)) ([]byte, syscall.Errno) {
	for range 4 {
		k, e := get(nil)
		if e != 0 {
			return nil, e
		}
		if k > maxXattr {
			return nil, syscall.E2BIG
		}
		if k == 0 {
			return []byte{}, 0
		}
		buf := make([]byte, k)
		k, e = get(buf)
		if e == syscall.ERANGE {
			continue
		}
		if e != 0 {
			return nil, e
		}
		return buf[:k], 0
	}
	return nil, syscall.ERANGE
}

// settable checks a Txattrcreate on p.
func (p *place) settable(m *p9wire.Xattrcreate) syscall.Errno {
	if _, e := p.node(syscall.ENOTSUP); e != 0 {
		return e
	}
	if m.Size > maxXattr {
		return syscall.E2BIG
	}
	return 0
}

// xattrcreate makes f the value of an xattr, which Twrites fill and
// Tclunk sets.
func (f *fileFid) xattrcreate(ctx context.Context, m *p9wire.Xattrcreate) (p9wire.Message, syscall.Errno) {
	if e := f.settable(m); e != 0 {
		return nil, e
	}
	if f.opened {
		return nil, syscall.EBADF
	}
	f.become(&xattrFid{place: f.place, set: &xattrSet{name: m.Name, flags: m.Flags, val: make([]byte, m.Size)}})
	return nil, 0
}

// An xattr fid is open already: Tlopen, Tlcreate and Txattrcreate find
// what is wrong with them first, as for a file, then answer EBADF.

func (x *xattrFid) lopen(ctx context.Context, m *p9wire.Lopen) (p9wire.Message, syscall.Errno) {
	if _, e := openFlags(m.Flags &^ journal.WriteBack); e != 0 {
		return nil, e
	}
	return nil, syscall.EBADF
}

func (x *xattrFid) lcreate(ctx context.Context, m *p9wire.Lcreate) (p9wire.Message, syscall.Errno) {
	if _, _, e := x.creating(m); e != 0 {
		return nil, e
	}
	return nil, syscall.EBADF
}

func (x *xattrFid) xattrcreate(ctx context.Context, m *p9wire.Xattrcreate) (p9wire.Message, syscall.Errno) {
	if e := x.settable(m); e != 0 {
		return nil, e
	}
	return nil, syscall.EBADF
}

func (x *xattrFid) read(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno) {
	if x.val == nil {
		return nil, syscall.EBADF
	}
	return readAt(x.val, m.Offset, min(m.Count, x.c.ioMax())), 0
}

func (x *xattrFid) write(ctx context.Context, m *p9wire.Write) (p9wire.Message, syscall.Errno) {
	s := x.set
	if s == nil {
		return nil, syscall.EBADF
	}
	x.smu.Lock()
	defer x.smu.Unlock()
	if m.Offset > uint64(len(s.val)) || uint64(len(m.Data)) > uint64(len(s.val))-m.Offset {
		return nil, syscall.EINVAL // past the size Txattrcreate gave
	}
	copy(s.val[m.Offset:], m.Data)
	return &p9wire.WriteReply{Count: uint32(len(m.Data))}, 0
}

// clunk sets the value a Txattrcreate gathered, if x has one. As Linux's
// client sends it for removexattr(2), a size of 0 with XATTR_REPLACE
// removes; without, it sets an empty value.
func (x *xattrFid) clunk(ctx context.Context) syscall.Errno {
	s := x.set
	if s == nil {
		return 0
	}
	if len(s.val) == 0 && s.flags&unix.XATTR_REPLACE != 0 {
		return x.rec.n.Removexattr(ctx, s.name)
	}
	return x.rec.n.Setxattr(ctx, s.name, s.val, s.flags)
}

// readAt answers a Tread of b, a value the fid holds whole.
func readAt(b []byte, off uint64, count uint32) *p9wire.DataReply {
	b = b[min(off, uint64(len(b))):]
	return &p9wire.DataReply{T: p9wire.Tread, Data: b[:min(len(b), int(count))]}
}
