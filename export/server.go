package export

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os/user"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
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
}

type reqKey struct{}

// loop reads c's requests until the stream ends or breaks, and serves each
// in its own goroutine.
func (c *conn) loop() {
	r := bufio.NewReaderSize(c.rw, 64<<10)
	for {
		c.wmu.Lock()
		msize := c.msize
		c.wmu.Unlock()
		h, body, err := p9wire.ReadFrame(r, msize)
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
		if err != nil {
			return // EOF, or a size below a header: no way to go on
		}
		c.s.requests.Add(1)
		c.s.counts.byType[h.Type].Add(1)
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
			old := d.U16()
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
			c.flight.Go(func() {
				defer func() { <-c.slots }()
				c.flush(h.Tag, old)
			})
			continue
		}
		ctx, cancel := context.WithCancel(c.ctx)
		q := &req{cancel: cancel, done: make(chan struct{})}
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
		c.flight.Go(func() {
			defer func() { <-c.slots }()
			defer close(q.done)
			defer cancel()
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
func (c *conn) send(q *req, tag uint16, e *p9wire.Enc) {
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
	b := e.Frame()
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
	c.send(nil, tag, p9wire.Msg(p9wire.Tflush+1, tag))
}

func rerror(tag uint16, e syscall.Errno) *p9wire.Enc {
	m := p9wire.Msg(p9wire.Rlerror, tag)
	m.U32(uint32(e))
	return m
}

// version starts a session: every fid of the one before goes.
func (c *conn) version(tag uint16, d *p9wire.Dec) *p9wire.Enc {
	msize, v := d.U32(), d.Str()
	if d.Err != nil || msize < minMsize {
		return rerror(tag, syscall.EINVAL)
	}
	c.releaseAll()
	// Clients that ask a later version of 9P2000.L (hugelgupf/p9's
	// 9P2000.L.Google.N) take the plain one.
	if v != p9wire.Version && !strings.HasPrefix(v, p9wire.Version+".") {
		v = "unknown"
	} else {
		v = p9wire.Version
	}
	msize = min(msize, maxMsize)
	c.wmu.Lock()
	c.msize = msize
	c.wmu.Unlock()
	m := p9wire.Msg(p9wire.Tversion+1, tag)
	m.U32(msize)
	m.Str(v)
	return m
}

// ioMax is the most data an Rread or Rreaddir may carry.
func (c *conn) ioMax() uint32 {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.msize - p9wire.HdrLen - 4
}

// serveOne serves one request and returns its reply.
func (c *conn) serveOne(ctx context.Context, typ uint8, tag uint16, d *p9wire.Dec) (reply *p9wire.Enc) {
	// A bug met by one request must not end every client's service: it
	// is logged with its stack and answered EIO.
	defer func() {
		if v := recover(); v != nil {
			c.s.panics.Add(1)
			c.s.log.Error("9p: a request panicked; answered EIO", "type", typ, "panic", v, "stack", string(debug.Stack()))
			reply = rerror(tag, syscall.EIO)
		}
	}()
	m := p9wire.Msg(typ+1, tag)
	h := handlers[typ]
	if h == nil {
		return rerror(tag, syscall.EOPNOTSUPP)
	}
	if e := h(c, ctx, d, m); e != 0 {
		return rerror(tag, e)
	}
	return m
}

// A handler decodes a request from d, serves it and appends its reply's
// fields to m; or it returns the error to answer. Handlers read every
// field before they act, and act only if d.Err is nil (malformed: EINVAL).
type handler func(c *conn, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno

var handlers [256]handler

func init() {
	handlers[p9wire.Tauth] = func(*conn, context.Context, *p9wire.Dec, *p9wire.Enc) syscall.Errno {
		// No 9P authentication: a key, when configured, is TLS before
		// any message. ENOENT is what clients (diod's, Linux's) take for
		// "attach without".
		return syscall.ENOENT
	}
	handlers[p9wire.Tattach] = (*conn).attach
	handlers[p9wire.Twalk] = (*conn).walk
	handlers[p9wire.Tclunk] = (*conn).clunk
	handlers[p9wire.Tremove] = (*conn).remove
	handlers[p9wire.Txattrwalk] = (*conn).xattrwalk
	handlers[p9wire.Tlink] = func(c *conn, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
		dfid, fid, name := d.U32(), d.U32(), d.Str()
		if d.Err != nil || badName(name) {
			return syscall.EINVAL
		}
		return c.pair(dfid, false, fid, func(f, o *file) syscall.Errno {
			return f.link(f.opCtx(ctx), o, name)
		})
	}
	handlers[p9wire.Trenameat] = func(c *conn, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
		olddir, oldName, newdir, newName := d.U32(), d.Str(), d.U32(), d.Str()
		if d.Err != nil || badName(oldName, newName) {
			return syscall.EINVAL
		}
		return c.pair(olddir, false, newdir, func(f, o *file) syscall.Errno {
			return f.renameat(f.opCtx(ctx), oldName, o, newName)
		})
	}
	handlers[p9wire.Trename] = func(c *conn, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
		fid, dfid, name := d.U32(), d.U32(), d.Str()
		if d.Err != nil || badName(name) {
			return syscall.EINVAL
		}
		return c.pair(fid, true, dfid, func(f, o *file) syscall.Errno {
			if o == f {
				return syscall.EINVAL // into itself
			}
			return f.rename(f.opCtx(ctx), o, name)
		})
	}
	for _, ops := range []struct {
		m    map[uint8]fidOp
		excl bool
	}{{fidOps, false}, {fidChanges, true}} {
		for typ, op := range ops.m {
			handlers[typ] = func(c *conn, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
				f, e := c.fid(d.U32())
				if e != 0 {
					return e
				}
				if !f.use(ops.excl) {
					return syscall.EBADF
				}
				defer f.done(ops.excl)
				if f.jt != nil {
					return f.jop(ctx, typ, d, m)
				}
				// The client may cache what it learns of the fid's file.
				c.note(ctx, f.r, f.qid())
				return op(f, f.opCtx(ctx), d, m)
			}
		}
	}
}

// pair serves op on the files of fids a and b (which may be one), both in
// use for the whole of it, a exclusively if excl: neither changes what it
// is nor is released meanwhile. Two files are taken in the order they
// were made, so that requests on the same two never wait for each other.
func (c *conn) pair(a uint32, excl bool, b uint32, op func(f, o *file) syscall.Errno) syscall.Errno {
	f, e := c.fid(a)
	if e != 0 {
		return e
	}
	o, e := c.fid(b)
	if e != 0 {
		return e
	}
	if o == f {
		if !f.use(excl) {
			return syscall.EBADF
		}
		defer f.done(excl)
		return op(f, f)
	}
	type user struct {
		f    *file
		excl bool
	}
	us := [2]user{{f, excl}, {o, false}}
	if o.seq < f.seq {
		us[0], us[1] = us[1], us[0]
	}
	if !us[0].f.use(us[0].excl) {
		return syscall.EBADF
	}
	defer us[0].f.done(us[0].excl)
	if !us[1].f.use(us[1].excl) {
		return syscall.EBADF
	}
	defer us[1].f.done(us[1].excl)
	return op(f, o)
}

type fidOp = func(f *file, ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno

// fidChanges are the requests that change what their fid is: they have it
// to themselves.
var fidChanges = map[uint8]fidOp{
	p9wire.Tlopen:       (*file).lopen,
	p9wire.Tlcreate:     (*file).lcreate,
	p9wire.Txattrcreate: (*file).xattrcreate,
}

// fidOps are the requests on one fid (its number first), served by the
// fid's file while it is in use.
var fidOps = map[uint8]fidOp{
	p9wire.Tread:     (*file).read,
	p9wire.Twrite:    (*file).write,
	p9wire.Tstatfs:   (*file).statfs,
	p9wire.Tgetattr:  (*file).getattr,
	p9wire.Tsetattr:  (*file).setattr,
	p9wire.Treaddir:  (*file).readdir,
	p9wire.Tfsync:    (*file).fsync,
	p9wire.Tlock:     (*file).lock,
	p9wire.Tgetlock:  (*file).getlock,
	p9wire.Tmkdir:    (*file).mkdir,
	p9wire.Tunlinkat: (*file).unlinkat,
	p9wire.Tsymlink:  (*file).symlink,
	p9wire.Tmknod:    (*file).mknod,
	p9wire.Treadlink: (*file).readlink,
}

// attach: n_uname, else uname in the user database, else nobody; the
// attach name is a root's, maybe followed by a path below it.
func (c *conn) attach(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	fid, _, uname, aname, uid := d.U32(), d.U32(), d.Str(), d.Str(), d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if uid == p9wire.NoUID {
		uid = nobody
		if u, err := user.Lookup(uname); err == nil {
			if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
				uid = uint32(n)
			}
		}
	}
	if c.full() {
		return syscall.EMFILE
	}
	f := &file{c: c, seq: c.seq.Add(1), who: c.s.caller(uid)}
	if strings.Trim(aname, "/") == journal.Aname {
		f.jt = newJnode(jRoot, nil)
		// The QID before the bind: once bound, a pipelined request on
		// the fid (a Tlcreate) may change what it names.
		q := f.jt.qid()
		if e := c.bind(fid, f, nil); e != 0 {
			return e
		}
		m.Qid(q)
		return 0
	}
	top, e := f.mount(ctx, "")
	if e != 0 {
		return e
	}
	var names []string
	if rest := strings.Trim(aname, "/"); rest != "" {
		names = strings.Split(rest, "/")
	}
	w, qids, e := f.walkFrom(ctx, walkState{at: top}, names)
	if e != 0 {
		return e
	}
	if len(qids) < len(names) {
		return syscall.ENOENT // the name after the last QID
	}
	// The attach's file is the top of its tree: ".." stops there.
	for _, u := range w.up {
		c.unref(u)
	}
	f.pos = w.at
	q := f.qid() // before the bind, as for the journal tree's
	if e := c.bind(fid, f, nil); e != 0 {
		f.release()
		return e
	}
	c.note(ctx, f.r, q)
	m.Qid(q)
	return 0
}

func (c *conn) walk(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	fid, newfid, n := d.U32(), d.U32(), int(d.U16())
	if n > p9wire.MaxWelem {
		return syscall.EINVAL
	}
	names := make([]string, n)
	for i := range names {
		names[i] = d.Str()
	}
	if d.Err != nil {
		return syscall.EINVAL
	}
	f, e := c.fid(fid)
	if e != 0 {
		return e
	}
	if !f.use(false) {
		return syscall.EBADF
	}
	nf, qids, e := f.walk(ctx, names)
	f.done(false)
	if e != 0 {
		return e
	}
	if nf != nil {
		var old *file
		if newfid == fid {
			old = f
		}
		if e := c.bind(newfid, nf, old); e != 0 {
			nf.release()
			return e
		}
	}
	m.U16(uint16(len(qids)))
	for _, q := range qids {
		m.Qid(q)
	}
	return 0
}

// clunk forgets fid; a value Txattrcreate gathered is set now, and its
// error is the clunk's.
func (c *conn) clunk(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	fid := d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	f, e := c.unbind(fid)
	if e != 0 {
		return e
	}
	f.stopReads()
	e = f.commitXattr(ctx)
	f.release()
	return e
}

// remove removes fid's file and clunks fid, even when it fails.
func (c *conn) remove(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	fid := d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	f, e := c.unbind(fid)
	if e != 0 {
		return e
	}
	defer f.release()
	return f.remove(ctx)
}

func (c *conn) xattrwalk(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	fid, newfid, name := d.U32(), d.U32(), d.Str()
	if d.Err != nil {
		return syscall.EINVAL
	}
	f, e := c.fid(fid)
	if e != 0 {
		return e
	}
	if !f.use(false) {
		return syscall.EBADF
	}
	c.note(ctx, f.r, f.qid())
	nf, e := f.xattrwalk(f.opCtx(ctx), name)
	f.done(false)
	if e != 0 {
		return e
	}
	if e := c.bind(newfid, nf, nil); e != 0 {
		nf.release()
		return e
	}
	m.U64(uint64(len(nf.xval)))
	return 0
}
