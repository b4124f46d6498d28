package export

import (
	"bufio"
	"context"
	"errors"
	"io"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/p9wire"
)

const (
	maxMsize = 4 << 20 // the largest msize a Tversion gets
	// minMsize is the smallest msize served: room for the fixed
	// messages and a useful Rread. A smaller one is refused, not raised:
	// the client would not read replies larger than it asked.
	minMsize = 512
	// maxInFlight bounds the requests of a connection served at once;
	// more wait to be read.
	maxInFlight = 64
	// maxWaiting bounds a connection's requests waiting on another
	// party out of their slots (unslot), each at most maxWaitingSize.
	maxWaiting     = 256
	maxWaitingSize = 4096
)

// writeTimeout bounds how long a reply may wait for the client to read
// (on connections with deadlines): a client that stops reading would
// otherwise hold every request's goroutine and every fid.
var writeTimeout = time.Minute

// req is a request in flight, known by its tag to Tflush.
type req struct {
	cancel context.CancelFunc
	done   chan struct{}
	// seen are the QIDs it noted in its connection's journal (conn.note),
	// noted again as the reply goes: a Reset or a Dropped record read
	// meanwhile may have cleared them, and the client caches what the
	// reply says after it has read them.
	seen []interestKey
	typs []uint8
	fids []uint32 // the fids it is in order on (order.go)

	c     *conn
	small bool        // its message is at most maxWaitingSize bytes
	freed sync.Once   // its slot was given back
	moved atomic.Bool // it holds a waiting place instead (unslot)
}

// freeSlot gives q's slot back, once: at its end, or when it starts to
// wait on another party (unslot).
func (q *req) freeSlot() { q.freed.Do(func() { <-q.c.slots }) }

// end ends q's hold of its slot or waiting place.
func (q *req) end() {
	q.freeSlot()
	if q.moved.Load() {
		<-q.c.waiting
	}
}

// unslot moves ctx's request from its slot to a waiting place as it
// starts to wait on another party: a client's journal, a recall's
// answer. That party's own requests may need a slot of this very
// connection (its journal read, when the party is this client), and a
// connection whose every slot a waiting request held would read nothing
// more until their timeouts. Waiting places are few (maxWaiting) and
// only for small messages (opens, name changes, journal records): a
// Twrite keeps its slot, so a client cannot keep more than the slots'
// worth of large messages waiting.
func unslot(ctx context.Context) {
	q, ok := ctx.Value(reqKey{}).(*req)
	if !ok || q.c == nil || !q.small || !q.moved.CompareAndSwap(false, true) {
		return
	}
	select {
	case q.c.waiting <- struct{}{}:
		q.freeSlot()
	default: // every place taken: it waits in its slot
		q.moved.Store(false)
	}
}

type reqKey struct{}

// loop reads c's requests until the stream ends or breaks, and serves each
// in its own goroutine.
func (c *conn) loop() {
	r := bufio.NewReaderSize(c.rw, 64<<10)
	admitted := false
	for {
		// Not under wmu: a reply the client is slow to take must not stop
		// the reading of its requests (a Tflush of the one it waits for).
		h, body, err := p9wire.ReadFrame(r, c.msize.Load())
		c.s.counts.bytesIn.Add(uint64(h.Size))
		if errors.Is(err, p9wire.ErrTooLarge) {
			// Skipped, not ended: the stream stays in step.
			c.s.requests.Add(1)
			c.s.counts.byType[h.Type].Add(1)
			if _, err := io.CopyN(io.Discard, r, int64(h.Size)-p9wire.HdrLen); err != nil {
				return
			}
			c.send(nil, h.Tag, rerror(h.Tag, syscall.EMSGSIZE))
			continue
		}
		if err != nil || c.fenced.Load() {
			return // EOF, a size below a header, or given up: no way to go on
		}
		c.s.requests.Add(1)
		c.s.counts.byType[h.Type].Add(1)
		if !admitted {
			if !c.admit() {
				c.refuse(h.Tag)
				return
			}
			admitted = true
		}
		c.last.Store(time.Now().UnixNano())
		d := &p9wire.Dec{B: body}
		switch h.Type {
		case p9wire.Tversion:
			// A new session aborts the requests of the old (9P's
			// version(5)) and waits for them: some, like a journal read
			// or a hung lower lookup, would wait for ever.
			c.cancelAll()
			c.flight.Wait()
			c.send(nil, h.Tag, c.version(h.Tag, d))
			continue
		case p9wire.Tflush:
			// A flush is a request in flight too: it waits for a slot,
			// but cancels first, so that the requests it flushes (maybe
			// all that hold the slots) end.
			var fl p9wire.Flush
			fl.Decode(d)
			old := fl.OldTag
			c.mu.Lock()
			q := c.tags[old]
			c.mu.Unlock()
			if q != nil {
				q.cancel()
			}
			select {
			case c.slots <- struct{}{}:
			case <-c.ctx.Done():
				return
			}
			c.inflight.Add(1)
			c.flight.Go(func() {
				defer c.inflight.Add(-1)
				defer func() { <-c.slots }()
				c.flush(h.Tag, old)
			})
			continue
		}
		ctx, cancel := context.WithCancel(c.ctx)
		q := &req{cancel: cancel, done: make(chan struct{}), c: c, small: len(body) <= maxWaitingSize}
		ctx = context.WithValue(ctx, reqKey{}, q)
		c.mu.Lock()
		_, dup := c.tags[h.Tag]
		if !dup {
			c.tags[h.Tag] = q
		}
		c.mu.Unlock()
		if dup {
			cancel()
			c.send(nil, h.Tag, rerror(h.Tag, syscall.EINVAL))
			continue
		}
		select {
		case c.slots <- struct{}{}:
		case <-c.ctx.Done():
			// Never served: a Tflush of it must not wait for it.
			cancel()
			close(q.done)
			return
		}
		after := c.ord.enter(q, h.Type, body)
		c.inflight.Add(1)
		c.flight.Go(func() {
			defer c.inflight.Add(-1)
			defer q.end()
			defer close(q.done)
			defer c.ord.leave(q)
			defer cancel()
			if !c.await(ctx, h.Type, q, after) {
				c.send(q, h.Tag, rerror(h.Tag, syscall.EINTR)) // flushed while it waited
				return
			}
			c.send(q, h.Tag, c.serveOne(ctx, h.Type, h.Tag, d))
		})
	}
}

// cancelAll cancels every request in flight.
func (c *conn) cancelAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.tags {
		q.cancel()
	}
}

// send writes a reply; q's tag is free again once it is on its way (a
// Tflush that then finds no tag answers after it). A reply the client
// does not take within writeTimeout, or that fails, ends the connection.
func (c *conn) send(q *req, tag uint16, b []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if q != nil {
		c.mu.Lock()
		delete(c.tags, tag)
		c.mu.Unlock()
	}
	if c.broken {
		return
	}
	if j := c.journal.Load(); j != nil && q != nil {
		for i, k := range q.seen {
			j.note(k, q.typs[i])
		}
	}
	if d, ok := c.rw.(interface{ SetWriteDeadline(time.Time) error }); ok {
		d.SetWriteDeadline(time.Now().Add(writeTimeout))
	}
	c.s.counts.bytesOut.Add(uint64(len(b)))
	if _, err := c.rw.Write(b); err != nil {
		// The client will not hear us: end the connection, and the
		// requests in flight with it.
		c.broken = true
		c.rw.Close()
		c.stop()
	}
}

// flush cancels the request of tag old and answers once it has ended, so
// that its reply, if any, comes before Rflush.
func (c *conn) flush(tag, old uint16) {
	c.mu.Lock()
	q := c.tags[old]
	c.mu.Unlock()
	if q != nil {
		q.cancel()
		<-q.done
	}
	c.send(nil, tag, p9wire.Encode(&p9wire.NoReply{T: p9wire.Tflush}, tag))
}

func rerror(tag uint16, e syscall.Errno) []byte {
	return p9wire.Encode(&p9wire.ErrorReply{Ecode: uint32(e)}, tag)
}

// version starts a session: every fid of the one before goes.
func (c *conn) version(tag uint16, d *p9wire.Dec) []byte {
	m := decode[p9wire.VersionReq](d)
	if m == nil || m.Msize < minMsize {
		return rerror(tag, syscall.EINVAL)
	}
	msize, v := m.Msize, m.Version
	c.releaseAll()
	// Clients that ask a later version of 9P2000.L (hugelgupf/p9's
	// 9P2000.L.Google.N) take the plain one.
	if v != p9wire.Version && !strings.HasPrefix(v, p9wire.Version+".") {
		v = "unknown"
	} else {
		v = p9wire.Version
	}
	msize = min(msize, maxMsize)
	c.msize.Store(msize)
	return p9wire.Encode(&p9wire.VersionReply{Msize: msize, Version: v}, tag)
}

// ioMax is the most data an Rread or Rreaddir may carry.
func (c *conn) ioMax() uint32 {
	return c.msize.Load() - p9wire.HdrLen - 4
}

// serveOne serves one request and returns its reply.
func (c *conn) serveOne(ctx context.Context, typ uint8, tag uint16, d *p9wire.Dec) (reply []byte) {
	// A bug met by one request must not end every client's service: it
	// is logged with its stack and answered EIO.
	defer func() {
		if v := recover(); v != nil {
			c.s.panics.Add(1)
			c.s.log.Error("9p: a request panicked; answered EIO", "type", typ, "panic", v, "stack", string(debug.Stack()))
			reply = rerror(tag, syscall.EIO)
		}
	}()
	h := handlers[typ]
	if h == nil {
		return rerror(tag, syscall.EOPNOTSUPP)
	}
	body := d.B
	m, e := h(c, ctx, d)
	if e != 0 {
		if e == syscall.EACCES || e == syscall.EPERM {
			c.refusedSquashed(typ, body, e)
		}
		return rerror(tag, e)
	}
	if m == nil {
		m = &p9wire.NoReply{T: typ}
	}
	return p9wire.Encode(m, tag)
}
