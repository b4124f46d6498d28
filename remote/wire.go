package remote

import (
	"encoding/binary"
	"errors"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
)

// The client speaks 9P2000.L itself rather than through hugelgupf/p9's
// Client: that one cannot do extended attributes (ENOSYS), sends Tlock
// without its fid, has no Tgetlock, puts no deadline on a request, and
// after a connection error its shared pool of replies can hand a stale
// answer to a request on another connection. The messages are few and
// fixed; they are encoded here.

// Message types (T; the reply is T+1).
const (
	tLerror      = 6 // Rlerror: 7
	tStatfs      = 8
	tLopen       = 12
	tLcreate     = 14
	tSymlink     = 16
	tMknod       = 18
	tRename      = 20
	tReadlink    = 22
	tGetattr     = 24
	tSetattr     = 26
	tXattrwalk   = 30
	tXattrcreate = 32
	tReaddir     = 40
	tFsync       = 50
	tLock        = 52
	tGetlock     = 54
	tLink        = 70
	tMkdir       = 72
	tRenameat    = 74
	tUnlinkat    = 76
	tVersion     = 100
	tAttach      = 104
	tWalk        = 110
	tRead        = 116
	tWrite       = 118
	tClunk       = 120
	tRemove      = 122
)

const (
	noTag    = 0xffff
	noFid    = ^uint32(0)
	hdrLen   = 7  // size[4] type[1] tag[2]
	ioHdrLen = 24 // the largest header of Twrite and Rread, so data fits msize
	maxWelem = 16 // names in one Twalk
)

// Tgetattr request and Rgetattr valid bits.
const (
	getattrBasic = 0x07ff
	getattrGen   = 0x1000
	getattrAll   = 0x3fff
)

// Tsetattr valid bits.
const (
	setattrMode     = 0x1
	setattrUID      = 0x2
	setattrGID      = 0x4
	setattrSize     = 0x8
	setattrAtime    = 0x10
	setattrMtime    = 0x20
	setattrCtime    = 0x40
	setattrAtimeSet = 0x80
	setattrMtimeSet = 0x100
)

// Tlock types and Rlock status.
const (
	lockRead   = 0
	lockWrite  = 1
	lockUnlock = 2

	lockSuccess = 0
	lockBlocked = 1
	lockError   = 2
	lockGrace   = 3
)

// errProto is a reply that is not 9P as we sent it: the stream cannot be
// trusted further.
var errProto = errors.New("9p: malformed reply")

// enc builds a message body.
type enc struct{ b []byte }

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) str(s string) {
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}
func (e *enc) bytes(p []byte) {
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}

// dec reads a reply body; a short body sets err and reads zeros.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || len(d.b) < n {
		d.err = errProto
		return make([]byte, n)
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}
func (d *dec) u8() uint8   { return d.take(1)[0] }
func (d *dec) u16() uint16 { return binary.LittleEndian.Uint16(d.take(2)) }
func (d *dec) u32() uint32 { return binary.LittleEndian.Uint32(d.take(4)) }
func (d *dec) u64() uint64 { return binary.LittleEndian.Uint64(d.take(8)) }
func (d *dec) str() string { return string(d.take(int(d.u16()))) }

type qid struct {
	typ  uint8
	vers uint32
	path uint64
}

func (d *dec) qid() qid { return qid{d.u8(), d.u32(), d.u64()} }

// rattr is an Rgetattr.
type rattr struct {
	valid uint64
	qid   qid
	attr  layer.Attr
	gen   uint64
}

func (d *dec) getattr() (r rattr) {
	r.valid = d.u64()
	r.qid = d.qid()
	a := &r.attr
	a.Mode = d.u32()
	a.Uid = d.u32()
	a.Gid = d.u32()
	a.Nlink = uint32(d.u64())
	a.Rdev = d.u64()
	a.Size = d.u64()
	a.Blksize = uint32(d.u64())
	a.Blocks = d.u64()
	ts := func() time.Time { s, ns := d.u64(), d.u64(); return time.Unix(int64(s), int64(ns)) }
	a.Atime = ts()
	a.Mtime = ts()
	a.Ctime = ts()
	ts() // btime
	r.gen = d.u64()
	d.u64() // data_version
	a.Ino = r.qid.path
	return r
}

// token is the identity of the file r describes: the server's inode
// number (QID path) and its generation when it reports one; servers that
// report none (gen 0 or not valid) get 1, so a token is never {ino, 0}.
func (r *rattr) token() layer.Token {
	gen := uint64(1)
	if r.valid&getattrGen != 0 && r.gen != 0 {
		gen = r.gen
	}
	return layer.Token{Ino: r.qid.path, Gen: gen}
}

// 9P2000.L open flags: Linux's generic values, fixed by the protocol, so
// they are mapped rather than passed (they differ on some architectures).
var openFlags = []struct{ host, wire uint32 }{
	{syscall.O_CREAT, 0o100},
	{syscall.O_EXCL, 0o200},
	{syscall.O_NOCTTY, 0o400},
	{syscall.O_TRUNC, 0o1000},
	{syscall.O_APPEND, 0o2000},
	{syscall.O_NONBLOCK, 0o4000},
	{syscall.O_DSYNC, 0o10000},
	{syscall.O_DIRECT, 0o40000},
	{syscall.O_LARGEFILE, 0o100000},
	{syscall.O_DIRECTORY, 0o200000},
	{syscall.O_NOFOLLOW, 0o400000},
	{syscall.O_NOATIME, 0o1000000},
	{syscall.O_SYNC, 0o4010000},
}

func wireFlags(f uint32) uint32 {
	w := f & syscall.O_ACCMODE
	for _, m := range openFlags {
		if m.host != 0 && f&m.host == m.host { // O_LARGEFILE is 0 on 64-bit hosts
			w |= m.wire
		}
	}
	return w
}

// errno turns a request's error into an Errno: the server's errno as it
// sent it, or EIO when the connection failed.
func errno(err error) layer.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
