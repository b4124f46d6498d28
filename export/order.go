package export

import (
	"context"
	"encoding/binary"
	"sync"

	"github.com/shalefs/shale/p9wire"
)

// Per-fid order (journal.OrdersFids). Each request is served on its own
// goroutine, so without an order a client that sends a Twalk and the
// Tlopen of the fid it makes together (one round trip for two, as
// pipelining NFS and 9P clients do) could have the Tlopen served first,
// on no fid. So a request waits for the earlier requests on its fids that
// change what a fid is (make, open or clunk it), and those wait for every
// earlier request on their fid. Reads, writes and the like of one fid
// stay concurrent with each other: the journal's blocked Tread must not
// hold up its Twrites. A waiting request holds its slot; what it waits
// for came first and holds one too, or a waiting place (unslot) while it
// waits on another party. So a client that sends more than the slots'
// worth of requests behind its own open of a fid, which waits for its
// own journal, holds every slot until that open ends (its recall
// timeout): only it waits.

// onFid is a request in flight on a fid.
type onFid struct {
	q       *req
	changes bool // it makes, opens or clunks the fid
}

// order is the requests in flight on each fid of a connection, in the
// order they arrived.
type order struct {
	mu   sync.Mutex
	fids map[uint32][]onFid
}

// fidsOf is the fids a request of type typ names in body, and whether it
// changes each.
func fidsOf(typ uint8, body []byte) (fids [2]uint32, changes [2]bool, n int) {
	u32 := func(at int) (uint32, bool) {
		if len(body) < at+4 {
			return 0, false
		}
		return binary.LittleEndian.Uint32(body[at:]), true
	}
	first, ok := u32(0)
	if !ok {
		return fids, changes, 0
	}
	fids[0], n = first, 1
	switch typ {
	case p9wire.Tauth, p9wire.Tlopen, p9wire.Tlcreate, p9wire.Txattrcreate, p9wire.Tclunk, p9wire.Tremove:
		changes[0] = true
	case p9wire.Tattach:
		changes[0] = true
		if afid, ok := u32(4); ok && afid != p9wire.NoFid {
			fids[1], n = afid, 2
		}
	case p9wire.Twalk, p9wire.Txattrwalk:
		if nf, ok := u32(4); ok {
			fids[1], changes[1], n = nf, true, 2
		}
	case p9wire.Trename, p9wire.Tlink:
		if f, ok := u32(4); ok {
			fids[1], n = f, 2
		}
	case p9wire.Trenameat:
		if len(body) >= 6 {
			at := 6 + int(binary.LittleEndian.Uint16(body[4:]))
			if f, ok := u32(at); ok {
				fids[1], n = f, 2
			}
		}
	}
	if n == 2 && fids[1] == fids[0] {
		changes[0], n = changes[0] || changes[1], 1
	}
	return fids, changes, n
}

// enter records q, of type typ, on its fids, and returns the requests it
// must wait for.
func (o *order) enter(q *req, typ uint8, body []byte) []*req {
	fids, changes, n := fidsOf(typ, body)
	if n == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fids == nil {
		o.fids = map[uint32][]onFid{}
	}
	var waits []*req
	for i, f := range fids[:n] {
		on := o.fids[f]
		for j := len(on) - 1; j >= 0; j-- {
			if changes[i] {
				waits = append(waits, on[j].q) // every request before
			} else if on[j].changes {
				waits = append(waits, on[j].q) // the last change, which waited for the rest
				break
			}
		}
		o.fids[f] = append(on, onFid{q, changes[i]})
		q.fids = append(q.fids, f)
	}
	return waits
}

// leave forgets q, which has been answered.
func (o *order) leave(q *req) {
	if len(q.fids) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range q.fids {
		on := o.fids[f]
		for j := range on {
			if on[j].q == q {
				on = append(on[:j], on[j+1:]...)
				break
			}
		}
		if len(on) == 0 {
			delete(o.fids, f)
		} else {
			o.fids[f] = on
		}
	}
}

// await waits for the requests q, of type typ, comes after; false if it
// was flushed meanwhile. A Tclunk or Tremove first ends the journal reads
// on its fid, which would wait for ever (and which it ends anyway).
func (c *conn) await(ctx context.Context, typ uint8, q *req, after []*req) bool {
	if len(after) == 0 {
		return true
	}
	if typ == p9wire.Tclunk || typ == p9wire.Tremove {
		if f, e := c.fid(q.fids[0]); e == 0 {
			f.interrupt()
		}
	}
	for _, w := range after {
		select {
		case <-w.done:
		case <-ctx.Done():
			return false
		}
	}
	return true
}
