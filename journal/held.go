package journal

import (
	"encoding/binary"
	"time"
)

// Attributes of delayed data (issue 23): a stat on one client of a file
// another client holds delayed writes of shows that client's size and
// mtime, as Sprite's server fetched them from the client caching the
// dirty data (seeds/001; NFSv4's CB_GETATTR).
//
// A controller asks only clients whose hello (a Clean of Qid path 0)
// has Follows in its Qid.Vers: a client that predates these kinds drops
// everything at a record kind it does not know.
const (
	// Follow, controller to client: another client follows Qid, which
	// this client opened for writing: send Held of it now, and again
	// before each close of it returns, while it holds delayed writes of
	// it.
	Follow Kind = 8
	// Held, client to controller: Qid as this client has it, its
	// delayed writes in: one HeldAttrs field, or none if it holds none. The
	// controller answers the write once every other client following
	// Qid has applied the Attrs record it makes of it.
	Held Kind = 9
)

// Follows, in the Qid.Vers of a client's hello: it takes Follow.
const Follows uint32 = 1

// HeldAttrs: a file's size and mtime as a client holding delayed writes
// of it has them. Value: size[8] mtime[8] (nanoseconds since 1970,
// signed).
const HeldAttrs FieldType = 5

// HeldField is the HeldAttrs field of size and mtime.
func HeldField(size uint64, mtime time.Time) Field {
	b := binary.LittleEndian.AppendUint64(nil, size)
	b = binary.LittleEndian.AppendUint64(b, uint64(mtime.UnixNano()))
	return Field{Type: HeldAttrs, Raw: b}
}

// HeldOf reads r's HeldAttrs field, if it has a well-formed one.
func HeldOf(r *Record) (size uint64, mtime time.Time, ok bool) {
	for _, f := range r.Fields {
		if f.Type == HeldAttrs && len(f.Raw) == 16 {
			ns := int64(binary.LittleEndian.Uint64(f.Raw[8:]))
			return binary.LittleEndian.Uint64(f.Raw), time.Unix(0, ns), true
		}
	}
	return 0, time.Time{}, false
}
