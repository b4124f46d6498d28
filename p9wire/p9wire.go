// Package p9wire is the 9P2000.L codec that shale's client (remote) and
// server (export) share: message numbers, framing, and the fields of the
// messages. Both speak the protocol themselves, not through a library:
// the messages are few and fixed, and the libraries' clients and servers
// got too much of the rest wrong (see remote and export).
package p9wire

import (
	"encoding/binary"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
)

// Message types (T; the reply is T+1).
const (
	Tlerror      = 6 // Rlerror: 7
	Tstatfs      = 8
	Tlopen       = 12
	Tlcreate     = 14
	Tsymlink     = 16
	Tmknod       = 18
	Trename      = 20
	Treadlink    = 22
	Tgetattr     = 24
	Tsetattr     = 26
	Txattrwalk   = 30
	Txattrcreate = 32
	Treaddir     = 40
	Tfsync       = 50
	Tlock        = 52
	Tgetlock     = 54
	Tlink        = 70
	Tmkdir       = 72
	Trenameat    = 74
	Tunlinkat    = 76
	Tversion     = 100
	Tauth        = 102
	Tattach      = 104
	Tflush       = 108
	Twalk        = 110
	Tread        = 116
	Twrite       = 118
	Tclunk       = 120
	Tremove      = 122

	Rlerror = Tlerror + 1
)

const (
	NoTag    = 0xffff
	NoFid    = ^uint32(0)
	NoUID    = ^uint32(0) // Tattach's n_uname when the client gives none
	HdrLen   = 7          // size[4] type[1] tag[2]
	IOHdrLen = 24         // the largest header of Twrite and Rread, so data fits msize
	MaxWelem = 16         // names in one Twalk
	Version  = "9P2000.L"
)

// Tgetattr request and Rgetattr valid bits.
const (
	GetattrBasic = 0x07ff
	GetattrGen   = 0x1000
	GetattrAll   = 0x3fff
)

// Tsetattr valid bits.
const (
	SetattrMode     = 0x1
	SetattrUID      = 0x2
	SetattrGID      = 0x4
	SetattrSize     = 0x8
	SetattrAtime    = 0x10
	SetattrMtime    = 0x20
	SetattrCtime    = 0x40
	SetattrAtimeSet = 0x80
	SetattrMtimeSet = 0x100
)

// Tlock and Tgetlock types, Tlock flags and Rlock status.
const (
	LockRead   = 0
	LockWrite  = 1
	LockUnlock = 2

	LockFlagsBlock = 1

	LockSuccess = 0
	LockBlocked = 1
	LockError   = 2
	LockGrace   = 3
)

// ErrProto is a message that is not 9P as the protocol has it: the stream
// cannot be trusted further.
var ErrProto = errors.New("9p: malformed message")

// ErrTooLarge is a frame larger than the limit its reader was given; its
// body is left unread (Header.Size-HdrLen bytes).
var ErrTooLarge = errors.New("9p: message larger than msize")

// Header is a frame's header.
type Header struct {
	Size uint32
	Type uint8
	Tag  uint16
}

// ReadFrame reads one frame of at most max bytes from r.
func ReadFrame(r io.Reader, max uint32) (Header, []byte, error) {
	var b [HdrLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return Header{}, nil, err
	}
	h := Header{binary.LittleEndian.Uint32(b[:]), b[4], binary.LittleEndian.Uint16(b[5:])}
	switch {
	case h.Size < HdrLen:
		return h, nil, ErrProto
	case h.Size > max:
		return h, nil, ErrTooLarge
	}
	body := make([]byte, h.Size-HdrLen)
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, err
	}
	return h, body, nil
}

// Enc builds a message.
type Enc struct{ B []byte }

// Msg starts a message of type typ with tag; Frame ends it.
func Msg(typ uint8, tag uint16) *Enc {
	e := &Enc{B: make([]byte, HdrLen, 64)}
	e.B[4] = typ
	binary.LittleEndian.PutUint16(e.B[5:], tag)
	return e
}

// Frame returns the message Msg started, its size set.
func (e *Enc) Frame() []byte {
	binary.LittleEndian.PutUint32(e.B, uint32(len(e.B)))
	return e.B
}

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Enc) Str(s string) {
	e.U16(uint16(len(s)))
	e.B = append(e.B, s...)
}

// Bytes appends p with a 32-bit count (Twrite, Rread).
func (e *Enc) Bytes(p []byte) {
	e.U32(uint32(len(p)))
	e.B = append(e.B, p...)
}

func (e *Enc) Qid(q Qid) {
	e.U8(q.Type)
	e.U32(q.Vers)
	e.U64(q.Path)
}

// Dec reads a message body. A short body sets Err: fixed-width fields
// then read as zeros, and Take, Str and Bytes as empty; nothing is ever
// allocated from a size the wire gave.
type Dec struct {
	B   []byte
	Err error
}

// zeros are what fixed-width fields read past the end: never written.
var zeros [8]byte

// Take returns the next n bytes, not copied; nil if there are fewer (or n
// is negative), which sets Err.
func (d *Dec) Take(n int) []byte {
	if d.Err != nil || n < 0 || n > len(d.B) {
		d.Err = ErrProto
		return nil
	}
	p := d.B[:n:n]
	d.B = d.B[n:]
	return p
}

// fixed returns the next n (at most 8) bytes, or zeros past the end.
func (d *Dec) fixed(n int) []byte {
	if d.Err != nil || n > len(d.B) {
		d.Err = ErrProto
		return zeros[:n:n]
	}
	p := d.B[:n:n]
	d.B = d.B[n:]
	return p
}

func (d *Dec) U8() uint8   { return d.fixed(1)[0] }
func (d *Dec) U16() uint16 { return binary.LittleEndian.Uint16(d.fixed(2)) }
func (d *Dec) U32() uint32 { return binary.LittleEndian.Uint32(d.fixed(4)) }
func (d *Dec) U64() uint64 { return binary.LittleEndian.Uint64(d.fixed(8)) }
func (d *Dec) Str() string { return string(d.Take(int(d.U16()))) }

// Bytes reads data with a 32-bit count (Twrite, Rread), not copied; nil
// if the body is shorter than the count.
func (d *Dec) Bytes() []byte {
	n := d.U32()
	if uint64(n) > uint64(len(d.B)) {
		d.Err = ErrProto
		return nil
	}
	return d.Take(int(n))
}

// Qid is a file's identity on the wire.
type Qid struct {
	Type uint8
	Vers uint32
	Path uint64
}

// QID types.
const (
	QTDir     = 0x80
	QTAuth    = 0x08
	QTSymlink = 0x02
	QTFile    = 0
)

// QidType is the QID type of a file of mode (its S_IFMT bits).
func QidType(mode uint32) uint8 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return QTDir
	case syscall.S_IFLNK:
		return QTSymlink
	}
	return QTFile
}

func (d *Dec) Qid() Qid { return Qid{d.U8(), d.U32(), d.U64()} }

// Rattr is an Rgetattr.
type Rattr struct {
	Valid uint64
	Qid   Qid
	Attr  layer.Attr
	Gen   uint64
}

func (d *Dec) Getattr() (r Rattr) {
	r.Valid = d.U64()
	r.Qid = d.Qid()
	a := &r.Attr
	a.Mode = d.U32()
	a.Uid = d.U32()
	a.Gid = d.U32()
	a.Nlink = uint32(d.U64())
	a.Rdev = d.U64()
	a.Size = d.U64()
	a.Blksize = uint32(d.U64())
	a.Blocks = d.U64()
	ts := func() time.Time { s, ns := d.U64(), d.U64(); return time.Unix(int64(s), int64(ns)) }
	a.Atime = ts()
	a.Mtime = ts()
	a.Ctime = ts()
	ts() // btime
	r.Gen = d.U64()
	d.U64() // data_version
	a.Ino = r.Qid.Path
	return r
}

func (e *Enc) Getattr(r *Rattr) {
	e.U64(r.Valid)
	e.Qid(r.Qid)
	a := &r.Attr
	e.U32(a.Mode)
	e.U32(a.Uid)
	e.U32(a.Gid)
	e.U64(uint64(a.Nlink))
	e.U64(a.Rdev)
	e.U64(a.Size)
	e.U64(uint64(a.Blksize))
	e.U64(a.Blocks)
	for _, t := range []time.Time{a.Atime, a.Mtime, a.Ctime, {}} {
		if t.IsZero() {
			e.U64(0)
			e.U64(0)
			continue
		}
		e.U64(uint64(t.Unix()))
		e.U64(uint64(t.Nanosecond()))
	}
	e.U64(r.Gen)
	e.U64(0) // data_version
}

// OpenFlags are 9P2000.L's open flags beside the host's: Linux's generic
// values, fixed by the protocol, so they are mapped rather than passed
// (they differ on some architectures). O_LARGEFILE is 0 on 64-bit hosts.
var OpenFlags = []struct{ Host, Wire uint32 }{
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

// WireFlags maps open(2) flags to 9P2000.L's.
func WireFlags(f uint32) uint32 {
	w := f & syscall.O_ACCMODE
	for _, m := range OpenFlags {
		if m.Host != 0 && f&m.Host == m.Host {
			w |= m.Wire
		}
	}
	return w
}

// HostFlags maps 9P2000.L open flags to open(2) flags.
func HostFlags(w uint32) uint32 {
	f := w & syscall.O_ACCMODE
	for _, m := range OpenFlags {
		if m.Host != 0 && w&m.Wire == m.Wire {
			f |= m.Host
		}
	}
	return f
}
