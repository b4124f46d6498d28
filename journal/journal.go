// Package journal is the journal-callback protocol (seeds/004, Srinivas and
// Filardo) between shale serve's cache controller and caching 9P clients:
// the records a client reads from its journal, and their wire form.
//
// A client names itself with a UUID. It attaches to the journal tree
// (attach name Aname) on the same connection as its attaches to the main
// tree, walks to the file named by its UUID, or creates it there
// (Tlcreate) if it is absent, and opens it. A created journal means the
// controller knew nothing of the client (a new client, one gone too long,
// or a controller that restarted): the client drops everything it cached.
//
// Reading the journal at offset N asks for the records after sequence
// number N, which tells the controller that those up to N are applied and
// may be forgotten. The read blocks until there is at least one record,
// then returns as many whole records as fit. Writing to the journal sends
// Dropped records: QIDs the client no longer caches, so the controller
// stops telling it of them.
//
// Every QID the controller returns on a connection with an open journal
// counts as cached by that client; a Change record tells it of a change
// to one, made by anyone but the client itself. A Reset record says the
// client must drop everything (records it needed were lost: it was gone
// too long, or fell too far behind); reading goes on after its sequence
// number. Every record carries the controller's epoch, drawn at its start:
// a client that sees another epoch than before drops everything.
//
// Records are framed type-length-value, so that the protocol can grow: a
// reader that meets a field type it does not know drops everything it
// holds for that record's QID, and one that meets a record kind it does
// not know drops everything.
//
//	record = size[4] kind[1] epoch[8] seq[8] qid[13] field*
//	field  = type[1] size[2] value[size]
//
// with size the bytes that follow it, little-endian as in 9P.
package journal

import (
	"encoding/binary"
	"errors"

	"github.com/shalefs/shale/p9wire"
)

// Aname is the attach name of the journal tree.
const Aname = "#journal"

// Kind is a record's kind.
type Kind uint8

const (
	Change  Kind = 1 // something about Qid changed; the fields say what
	Reset   Kind = 2 // drop everything cached (Qid is zero)
	Dropped Kind = 3 // client to controller: Qid is no longer cached

	// Sprite's consistency rules (seeds/001), between a controller and
	// clients that follow them (see Sprite below).

	// Recall, controller to client: write back the data of Qid you hold
	// dirty, then send Clean of Qid. Another client is opening the file.
	Recall Kind = 4
	// Uncache, controller to client: Qid is open on another client and
	// one of you writes it. Write back its dirty data, send Clean of it,
	// and cache none of its data (read and write through to the server)
	// until an open of it is answered without NoCache.
	Uncache Kind = 5
	// Dirty, client to controller: this client holds data of Qid not
	// yet written back. Sent after a reconnection, to reclaim what the
	// controller (restarted, or told of no open) does not know of.
	Dirty Kind = 6
	// Clean, client to controller: this client holds no dirty data of
	// Qid; its Seq is that of the Recall or Uncache it answers. With Seq
	// 0 the client says it of itself (it wrote its data back, or writes
	// through), and Qid.Vers is the version of its last open of the file
	// for writing: the controller then need not recall from it. A Clean
	// of Qid path 0 is the client's hello: it follows Sprite's rules, so
	// the controller may send it Recall and Uncache, and it has sent
	// every Dirty it had to reclaim. With a Seq (that of a Reset, which
	// may have stood for lost Recalls), it also says that every file was
	// written back: it answers all that was asked before. With Seq
	// Goodbye, the client is ending with nothing dirty: forget its marks.
	Clean Kind = 7
)

// Sprite's rules on the wire. A controller that follows them gives its
// journal files this QID version (in Rwalk, Rlopen and Rlcreate); with
// any other version a client writes through and caches as before. The
// controller then answers every Tlopen and Tlcreate of a regular file
// with the file's version in the QID: 30 bits, bumped by each open for
// writing, so an open for reading finds the version it cached and an
// open for writing the one after it; bit NoCache set means the file is
// write-shared with another client now: cache none of its data.
const (
	Sprite  uint32 = 0x53505231 // "SPR1"
	NoCache uint32 = 1 << 31
	// WriteBack, a Tlopen flag: the open only writes back delayed data
	// (no program opened the file): it bumps no version and shares
	// nothing.
	WriteBack uint32 = 1 << 30
)

// Capabilities of the server, in the Qid.Vers of the journal tree's root
// (Rattach): what a client may count on beyond 9P2000.L.
const (
	// FillsReaddir: an Rreaddir holds as many entries as fit its count,
	// so one with room left for the longest entry (MaxDirent) ends the
	// listing, and the Treaddir that would read nothing need not go.
	FillsReaddir uint32 = 1
	// OrdersFids: a request waits for the requests sent before it that
	// make, open or clunk one of its fids, so a client may send a Twalk,
	// the Tlopen of the fid it makes and more without waiting between.
	OrdersFids uint32 = 2
	// KeepsLocks: a Tlock that takes a write lock, or a Tgetlock of one,
	// first takes back every other client's delegation of the file
	// (Return), and a file another client's open has locked is not
	// delegated: so a client may keep the shared locks of a file it
	// holds a delegation of to itself, and take them to the server
	// (Tlocks) before it answers the Return (issue 27).
	KeepsLocks uint32 = 4
)

// MaxDirent is the size of the longest entry of an Rreaddir: qid[13]
// offset[8] type[1] and a name of 255 bytes (name[s]).
const MaxDirent = 13 + 8 + 1 + 2 + 255

// Goodbye is the Seq of a client's last Clean (of Qid path 0).
const Goodbye = ^uint64(0)

// NextVersion is the version after v, as an open for writing makes it.
func NextVersion(v uint32) uint32 { return VersionOf(v + 1) }

// FieldType is a field's type.
type FieldType uint8

const (
	// Attrs: attributes changed (mode, owner, times, links, extended
	// attributes). No value.
	Attrs FieldType = 1
	// Data: bytes changed, and so size and times. Value: off[8] len[8];
	// len 0 means from off to the end, whatever the size.
	Data FieldType = 2
	// Entry: an entry of directory Qid was added, removed or replaced.
	// Value: op[1] name, op one of EntryAdded, EntryRemoved,
	// EntryChanged (one of them, not known which).
	Entry FieldType = 3
	// Whole: anything about Qid may have changed (a directory entry the
	// controller cannot name in the client's terms): the reader drops
	// all it holds of Qid, as readers that predate it do for any type
	// they do not know. No value.
	Whole FieldType = 4
)

// Entry ops.
const (
	EntryChanged = 0
	EntryAdded   = 1
	EntryRemoved = 2
)

// Field is one thing that changed. Unknown types keep their raw value.
type Field struct {
	Type     FieldType
	Off, Len uint64 // Data
	Op       uint8  // Entry
	Name     string // Entry
	Raw      []byte // any other type: its value, as read
}

// Record is one journal record.
type Record struct {
	Kind   Kind
	Epoch  uint64
	Seq    uint64
	Qid    p9wire.Qid
	Fields []Field
}

// MaxRecord bounds a record's encoded size: a name is at most 255 bytes,
// so a record past this is malformed.
const MaxRecord = 64 << 10

const recordHdr = 4 + 1 + 8 + 8 + 13

// ErrFormat is a record that is not well framed.
var ErrFormat = errors.New("journal: malformed record")

// Append appends r's wire form to b.
func Append(b []byte, r *Record) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, byte(r.Kind))
	b = binary.LittleEndian.AppendUint64(b, r.Epoch)
	b = binary.LittleEndian.AppendUint64(b, r.Seq)
	b = append(b, r.Qid.Type)
	b = binary.LittleEndian.AppendUint32(b, r.Qid.Vers)
	b = binary.LittleEndian.AppendUint64(b, r.Qid.Path)
	for _, f := range r.Fields {
		b = appendField(b, &f)
	}
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

func appendField(b []byte, f *Field) []byte {
	b = append(b, byte(f.Type), 0, 0)
	at := len(b)
	switch f.Type {
	case Data:
		b = binary.LittleEndian.AppendUint64(b, f.Off)
		b = binary.LittleEndian.AppendUint64(b, f.Len)
	case Entry:
		b = append(b, f.Op)
		b = append(b, f.Name...)
	case Attrs:
	default:
		b = append(b, f.Raw...)
	}
	binary.LittleEndian.PutUint16(b[at-2:], uint16(len(b)-at))
	return b
}

// Size is the length of r's wire form.
func Size(r *Record) int { return len(Append(nil, r)) }

// Next decodes the first record of b and returns it with the rest of b.
// A record cut short at the end of b is ErrFormat, as is one whose fields
// do not fill it exactly; nothing is allocated from a size b gives.
func Next(b []byte) (Record, []byte, error) {
	var r Record
	if len(b) < recordHdr {
		return r, b, ErrFormat
	}
	n := binary.LittleEndian.Uint32(b)
	if n < recordHdr-4 || n > MaxRecord || uint64(n) > uint64(len(b)-4) {
		return r, b, ErrFormat
	}
	rec, rest := b[4:4+n], b[4+n:]
	r.Kind = Kind(rec[0])
	r.Epoch = binary.LittleEndian.Uint64(rec[1:])
	r.Seq = binary.LittleEndian.Uint64(rec[9:])
	r.Qid = p9wire.Qid{Type: rec[17], Vers: binary.LittleEndian.Uint32(rec[18:]), Path: binary.LittleEndian.Uint64(rec[22:])}
	for fs := rec[recordHdr-4:]; len(fs) > 0; {
		if len(fs) < 3 {
			return Record{}, b, ErrFormat
		}
		t, k := FieldType(fs[0]), int(binary.LittleEndian.Uint16(fs[1:]))
		if k > len(fs)-3 {
			return Record{}, b, ErrFormat
		}
		v := fs[3 : 3+k]
		fs = fs[3+k:]
		f := Field{Type: t}
		switch t {
		case Data:
			if k != 16 {
				return Record{}, b, ErrFormat
			}
			f.Off, f.Len = binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint64(v[8:])
		case Entry:
			if k < 2 {
				return Record{}, b, ErrFormat
			}
			f.Op, f.Name = v[0], string(v[1:])
		case Attrs:
			if k != 0 {
				return Record{}, b, ErrFormat
			}
		default:
			f.Raw = append([]byte(nil), v...)
		}
		r.Fields = append(r.Fields, f)
	}
	return r, rest, nil
}

// Known tells whether a reader of this version understands every field
// of r: one that does not drops everything it holds for r.Qid.
func (r *Record) Known() bool {
	for _, f := range r.Fields {
		if f.Type != Attrs && f.Type != Data && f.Type != Entry {
			return false
		}
	}
	return true
}
