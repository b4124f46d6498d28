package remote

import (
	"bufio"
	"container/list"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/user"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shalefs/shale/p9wire"
)

// errLost fails the requests of a connection that broke or timed out;
// callers see EIO.
var errLost = errors.New("9p: connection lost")

var errTimeout = errors.New("9p: no reply within the timeout")

// conn is one 9P connection: requests are tagged and may be in flight
// together; one goroutine reads the replies. Fids belong to a connection
// and die with it.
type conn struct {
	nc      net.Conn
	msize   uint32
	timeout time.Duration
	aname   string
	log     *slog.Logger
	onDead  func(*conn)
	ctr     *counters

	wmu sync.Mutex // one message on the wire at a time

	mu      sync.Mutex
	pending map[uint16]chan reply
	nextTag uint16
	nextFid uint32
	freeFid []uint32
	roots   map[uint32]*root // the attach of each uid
	dead    chan struct{}    // closed when the connection failed
	err     error
	maxIdle int       // idle node fids kept (see nodeFid)
	idle    list.List // the idle node fids, least recently used first
}

type reply struct {
	typ  uint8
	body []byte
}

// root is a uid's attach, made on its first request.
type root struct {
	done chan struct{}
	fid  uint32
	err  error
}

// newConn negotiates the version on nc and starts reading replies.
func newConn(nc net.Conn, msize uint32, timeout time.Duration, aname string, maxIdle int, log *slog.Logger, ctr *counters, onDead func(*conn)) (*conn, error) {
	c := &conn{nc: nc, msize: msize, timeout: timeout, aname: aname, maxIdle: maxIdle, log: log, ctr: ctr, onDead: onDead,
		pending: map[uint16]chan reply{}, roots: map[uint32]*root{}, nextFid: 1, dead: make(chan struct{})}
	// Tversion before the reader starts: it is the one request alone on
	// the wire, and a server that never answers must not hang us.
	nc.SetDeadline(time.Now().Add(timeout))
	e := p9wire.Msg(p9wire.Tversion, p9wire.NoTag)
	e.U32(msize)
	e.Str(p9wire.Version)
	if _, err := nc.Write(e.Frame()); err != nil {
		return nil, versionErr(err, timeout)
	}
	h, body, err := p9wire.ReadFrame(nc, 1<<16)
	if err != nil {
		return nil, versionErr(err, timeout)
	}
	d := p9wire.Dec{B: body}
	if h.Type == p9wire.Rlerror {
		return nil, fmt.Errorf("refused version %s (%v): shale needs a 9P2000.L server, such as shale serve or diod", p9wire.Version, syscall.Errno(d.U32()))
	}
	m, v := d.U32(), d.Str()
	if h.Type != p9wire.Tversion+1 || d.Err != nil {
		return nil, fmt.Errorf("answered the version request with something that is not 9P: is it a 9P server, and does it need a key (?keyfile=FILE)?")
	}
	if v != p9wire.Version {
		return nil, fmt.Errorf("speaks %q, not %s: shale needs a 9P2000.L server, such as shale serve or diod", v, p9wire.Version)
	}
	if m < c.msize {
		c.msize = m
	}
	if c.msize < 4096 {
		return nil, fmt.Errorf("offers messages of %d bytes, too small to work with (4096 at least): raise the server's msize", c.msize)
	}
	nc.SetDeadline(time.Time{})
	go c.read()
	return c, nil
}

// versionErr says why the version negotiation failed, after "9p server at
// ADDR ": a server that wants a key closes the connection of a client
// without one.
func versionErr(err error, timeout time.Duration) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed):
		return errors.New("closed the connection during version negotiation: does it need a key (?keyfile=FILE)?")
	case errors.As(err, &ne) && ne.Timeout():
		// A server that wants a key reads the request as the start of a
		// TLS record, and waits for the rest until its handshake times out.
		return fmt.Errorf("did not answer the version request within %v: is it a 9P server, and does it need a key (?keyfile=FILE)? (?timeout=DURATION waits longer)", timeout)
	case errors.Is(err, p9wire.ErrProto) || errors.Is(err, p9wire.ErrTooLarge):
		return errors.New("answered the version request with something that is not 9P: is it a 9P server, and does it need a key (?keyfile=FILE)?")
	}
	return fmt.Errorf("failed during version negotiation (%v): is it a 9P server, and does it need a key (?keyfile=FILE)?", err)
}

func (c *conn) write(typ uint8, tag uint16, body []byte) error {
	e := p9wire.Msg(typ, tag)
	e.B = append(e.B, body...)
	f := e.Frame()
	c.ctr.sent.Add(uint64(len(f)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(f)
	return err
}

func (c *conn) read() {
	r := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		h, body, err := p9wire.ReadFrame(r, c.msize)
		if err != nil {
			c.fail(err)
			return
		}
		c.ctr.recv.Add(uint64(p9wire.HdrLen + len(body)))
		c.mu.Lock()
		ch := c.pending[h.Tag]
		delete(c.pending, h.Tag)
		c.mu.Unlock()
		if ch == nil {
			c.fail(p9wire.ErrProto) // a tag we never sent: the stream is not ours
			return
		}
		ch <- reply{h.Type, body}
	}
}

// fail ends the connection: every request in flight and every later one
// gets errLost, and the client dials again.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.dead)
	c.mu.Unlock()
	c.nc.Close()
	if err != errClosed {
		c.log.Warn("9p connection lost", "err", err)
	}
	c.onDead(c)
}

func (c *conn) alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// close ends the connection on the client's behalf.
// errClosed ends a connection on purpose: nothing to warn about.
var errClosed = errors.New("closed")

func (c *conn) close() { c.fail(errClosed) }

// rpc sends one request and waits for its reply. A server error is a
// syscall.Errno; anything else means the connection failed. There is no
// Tflush: a request that gets no reply within the timeout fails, and so
// does its connection, which is closed so that every other request in
// flight fails at once instead of waiting for its own timeout.
func (c *conn) rpc(typ uint8, body []byte) (*p9wire.Dec, error) {
	c.ctr.reqs[typ].Add(1)
	return c.call(typ, body, c.timeout)
}

// call is rpc without counting, with a timeout of its own: 0 waits for
// the reply as long as the connection lives (the journal's blocking read).
func (c *conn) call(typ uint8, body []byte, timeout time.Duration) (*p9wire.Dec, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, errLost
	}
	tag, ok := c.tag()
	if !ok {
		c.mu.Unlock()
		return nil, syscall.EAGAIN
	}
	c.pending[tag] = ch
	c.mu.Unlock()
	if timeout > 0 {
		timer := time.AfterFunc(timeout, func() { c.fail(errTimeout) })
		defer timer.Stop()
	}
	if err := c.write(typ, tag, body); err != nil {
		c.fail(err)
		return nil, errLost
	}
	var r reply
	select {
	case r = <-ch:
	case <-c.dead:
		select {
		case r = <-ch: // it made it before the end
		default:
			return nil, errLost
		}
	}
	d := &p9wire.Dec{B: r.body}
	switch {
	case r.typ == p9wire.Rlerror:
		e := d.U32()
		if d.Err != nil {
			c.fail(p9wire.ErrProto)
			return nil, errLost
		}
		return nil, syscall.Errno(e)
	case r.typ != typ+1:
		c.fail(p9wire.ErrProto)
		return nil, errLost
	}
	return d, nil
}

// tag finds a free tag; c.mu is held.
func (c *conn) tag() (uint16, bool) {
	for range 1 << 16 {
		t := c.nextTag
		c.nextTag++
		if t == p9wire.NoTag {
			continue
		}
		if _, used := c.pending[t]; !used {
			return t, true
		}
	}
	return 0, false
}

func (c *conn) newFid() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.freeFid); n > 0 {
		f := c.freeFid[n-1]
		c.freeFid = c.freeFid[:n-1]
		return f
	}
	c.nextFid++
	return c.nextFid - 1
}

func (c *conn) putFid(f uint32) {
	c.mu.Lock()
	c.freeFid = append(c.freeFid, f)
	c.mu.Unlock()
}

// clunk releases fid; the server forgets it even when it answers an
// error, which then is the error of the operation clunk completes
// (Txattrcreate's).
func (c *conn) clunk(fid uint32) error {
	var e p9wire.Enc
	e.U32(fid)
	_, err := c.rpc(p9wire.Tclunk, e.B)
	if err == nil || errors.As(err, new(syscall.Errno)) {
		c.putFid(fid)
	}
	return err
}

// root returns uid's attach fid, attaching on first use.
func (c *conn) root(uid uint32) (uint32, error) {
	c.mu.Lock()
	r := c.roots[uid]
	if r == nil {
		r = &root{done: make(chan struct{})}
		c.roots[uid] = r
		c.mu.Unlock()
		r.fid = c.newFid()
		r.err = c.attachAs(r.fid, uid, c.aname)
		if r.err != nil {
			c.mu.Lock()
			delete(c.roots, uid) // try again on the next request
			c.mu.Unlock()
		}
		close(r.done)
	} else {
		c.mu.Unlock()
		<-r.done
	}
	return r.fid, r.err
}

// attachAs attaches fid to the tree aname as uid: n_uname carries it,
// and uname its name when the local user database knows it, for servers
// that look users up by name. On failure fid is free again.
func (c *conn) attachAs(fid, uid uint32, aname string) error {
	uname := ""
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		uname = u.Username
	}
	var e p9wire.Enc
	e.U32(fid)
	e.U32(p9wire.NoFid)
	e.Str(uname)
	e.Str(aname)
	e.U32(uid)
	d, err := c.rpc(p9wire.Tattach, e.B)
	if err != nil {
		c.putFid(fid)
		return err
	}
	d.Qid()
	if d.Err != nil {
		c.fail(p9wire.ErrProto)
		return errLost
	}
	return nil
}

// twalk walks fid to newfid by names (at most p9wire.MaxWelem).
func (c *conn) twalk(fid, newfid uint32, names []string) ([]p9wire.Qid, error) {
	var e p9wire.Enc
	e.U32(fid)
	e.U32(newfid)
	e.U16(uint16(len(names)))
	for _, n := range names {
		e.Str(n)
	}
	d, err := c.rpc(p9wire.Twalk, e.B)
	if err != nil {
		return nil, err
	}
	qs := make([]p9wire.Qid, d.U16())
	for i := range qs {
		qs[i] = d.Qid()
	}
	if d.Err != nil || len(qs) > len(names) {
		c.fail(p9wire.ErrProto)
		return nil, errLost
	}
	return qs, nil
}

// walk returns a new fid for names beneath fid (a clone for none) and
// the QID of the last name.
func (c *conn) walk(fid uint32, names []string) (uint32, p9wire.Qid, error) {
	nf := c.newFid()
	src := fid
	var last p9wire.Qid
	for first := true; first || len(names) > 0; first = false {
		k := min(len(names), p9wire.MaxWelem)
		qs, err := c.twalk(src, nf, names[:k])
		if err == nil && len(qs) < k {
			err = syscall.ENOENT // a partial walk: the name after the last QID is missing
		}
		if err != nil {
			if src == nf {
				c.clunk(nf)
			} else {
				c.putFid(nf)
			}
			return 0, p9wire.Qid{}, err
		}
		if k > 0 {
			last = qs[k-1]
		}
		names = names[k:]
		src = nf
	}
	return nf, last, nil
}

func (c *conn) getattr(fid uint32) (p9wire.Rattr, error) {
	var e p9wire.Enc
	e.U32(fid)
	e.U64(p9wire.GetattrAll)
	d, err := c.rpc(p9wire.Tgetattr, e.B)
	if err != nil {
		return p9wire.Rattr{}, err
	}
	r := d.Getattr()
	if d.Err != nil {
		c.fail(p9wire.ErrProto)
		return p9wire.Rattr{}, errLost
	}
	return r, nil
}

// lopen opens fid with 9P2000.L flags and returns its QID and iounit.
func (c *conn) lopen(fid, flags uint32) (p9wire.Qid, uint32, error) {
	var e p9wire.Enc
	e.U32(fid)
	e.U32(flags)
	d, err := c.rpc(p9wire.Tlopen, e.B)
	if err != nil {
		return p9wire.Qid{}, 0, err
	}
	q := d.Qid()
	return q, d.U32(), nil
}

// setMtime sets fid's modification time to t (Tsetattr), and reports
// whether the server did.
func (c *conn) setMtime(fid uint32, t time.Time) bool {
	var b p9wire.Enc
	b.U32(fid)
	b.U32(p9wire.SetattrMtime | p9wire.SetattrMtimeSet)
	b.U32(0)
	b.U32(0)
	b.U32(0)
	b.U64(0)
	b.U64(0)
	b.U64(0)
	b.U64(uint64(t.Unix()))
	b.U64(uint64(t.Nanosecond()))
	_, err := c.rpc(p9wire.Tsetattr, b.B)
	return err == nil
}

// ioSize is how many bytes one Tread or Twrite on a fid with iounit moves.
func (c *conn) ioSize(iounit uint32) int {
	n := c.msize - p9wire.IOHdrLen
	if iounit != 0 && iounit < n {
		n = iounit
	}
	return int(n)
}

func (c *conn) readAt(fid uint32, iounit uint32, dest []byte, off int64) (int, error) {
	total := 0
	for total < len(dest) {
		want := min(len(dest)-total, c.ioSize(iounit))
		var e p9wire.Enc
		e.U32(fid)
		e.U64(uint64(off) + uint64(total))
		e.U32(uint32(want))
		d, err := c.rpc(p9wire.Tread, e.B)
		if err != nil {
			return total, err
		}
		n := int(d.U32())
		if d.Err != nil || n > want || n > len(d.B) {
			c.fail(p9wire.ErrProto)
			return total, errLost
		}
		copy(dest[total:], d.B[:n])
		total += n
		if n < want {
			break // end of file, or what the server had
		}
	}
	return total, nil
}

func (c *conn) writeAt(fid uint32, iounit uint32, data []byte, off int64) (int, error) {
	total := 0
	for {
		chunk := data[total:min(len(data), total+c.ioSize(iounit))]
		var e p9wire.Enc
		e.U32(fid)
		e.U64(uint64(off) + uint64(total))
		e.Bytes(chunk)
		d, err := c.rpc(p9wire.Twrite, e.B)
		if err != nil {
			return total, err
		}
		n := int(d.U32())
		if d.Err != nil || n > len(chunk) {
			c.fail(p9wire.ErrProto)
			return total, errLost
		}
		total += n
		if total >= len(data) || n < len(chunk) {
			return total, nil
		}
	}
}
