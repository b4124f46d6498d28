package remote

import (
	"bufio"
	"encoding/binary"
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

	wmu sync.Mutex // one message on the wire at a time

	mu      sync.Mutex
	pending map[uint16]chan reply
	nextTag uint16
	nextFid uint32
	freeFid []uint32
	roots   map[uint32]*root // the attach of each uid
	dead    chan struct{}    // closed when the connection failed
	err     error
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
func newConn(nc net.Conn, msize uint32, timeout time.Duration, aname string, log *slog.Logger, onDead func(*conn)) (*conn, error) {
	c := &conn{nc: nc, msize: msize, timeout: timeout, aname: aname, log: log, onDead: onDead,
		pending: map[uint16]chan reply{}, roots: map[uint32]*root{}, nextFid: 1, dead: make(chan struct{})}
	// Tversion before the reader starts: it is the one request alone on
	// the wire, and a server that never answers must not hang us.
	nc.SetDeadline(time.Now().Add(timeout))
	var e enc
	e.u32(msize)
	e.str("9P2000.L")
	if err := c.write(tVersion, noTag, e.b); err != nil {
		return nil, err
	}
	hdr := make([]byte, hdrLen)
	if _, err := io.ReadFull(nc, hdr); err != nil {
		return nil, fmt.Errorf("9p version: %w", err)
	}
	size := binary.LittleEndian.Uint32(hdr)
	if size < hdrLen || size > 1<<16 {
		return nil, fmt.Errorf("9p version: %w", errProto)
	}
	body := make([]byte, size-hdrLen)
	if _, err := io.ReadFull(nc, body); err != nil {
		return nil, fmt.Errorf("9p version: %w", err)
	}
	d := dec{b: body}
	if hdr[4] == tLerror+1 {
		return nil, fmt.Errorf("9p version: %w", syscall.Errno(d.u32()))
	}
	m, v := d.u32(), d.str()
	if hdr[4] != tVersion+1 || d.err != nil || v != "9P2000.L" {
		return nil, fmt.Errorf("9p version: the server speaks %q, not 9P2000.L", v)
	}
	if m < c.msize {
		c.msize = m
	}
	if c.msize < 4096 {
		return nil, fmt.Errorf("9p version: message size %d is too small", c.msize)
	}
	nc.SetDeadline(time.Time{})
	go c.read()
	return c, nil
}

func (c *conn) write(typ uint8, tag uint16, body []byte) error {
	msg := make([]byte, hdrLen, hdrLen+len(body))
	binary.LittleEndian.PutUint32(msg, uint32(hdrLen+len(body)))
	msg[4] = typ
	binary.LittleEndian.PutUint16(msg[5:], tag)
	msg = append(msg, body...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(msg)
	return err
}

func (c *conn) read() {
	r := bufio.NewReaderSize(c.nc, 64<<10)
	hdr := make([]byte, hdrLen)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			c.fail(err)
			return
		}
		size := binary.LittleEndian.Uint32(hdr)
		if size < hdrLen || size > c.msize {
			c.fail(errProto)
			return
		}
		body := make([]byte, size-hdrLen)
		if _, err := io.ReadFull(r, body); err != nil {
			c.fail(err)
			return
		}
		tag := binary.LittleEndian.Uint16(hdr[5:])
		c.mu.Lock()
		ch := c.pending[tag]
		delete(c.pending, tag)
		c.mu.Unlock()
		if ch == nil {
			c.fail(errProto) // a tag we never sent: the stream is not ours
			return
		}
		ch <- reply{hdr[4], body}
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
func (c *conn) rpc(typ uint8, body []byte) (*dec, error) {
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
	timer := time.AfterFunc(c.timeout, func() { c.fail(errTimeout) })
	defer timer.Stop()
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
	d := &dec{b: r.body}
	switch {
	case r.typ == tLerror+1:
		e := d.u32()
		if d.err != nil {
			c.fail(errProto)
			return nil, errLost
		}
		return nil, syscall.Errno(e)
	case r.typ != typ+1:
		c.fail(errProto)
		return nil, errLost
	}
	return d, nil
}

// tag finds a free tag; c.mu is held.
func (c *conn) tag() (uint16, bool) {
	for range 1 << 16 {
		t := c.nextTag
		c.nextTag++
		if t == noTag {
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
	var e enc
	e.u32(fid)
	_, err := c.rpc(tClunk, e.b)
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
		r.fid, r.err = c.attach(uid)
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

// attach sends Tattach as uid: n_uname carries it, and uname its name
// when the local user database knows it, for servers that look users up
// by name.
func (c *conn) attach(uid uint32) (uint32, error) {
	fid := c.newFid()
	uname := ""
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		uname = u.Username
	}
	var e enc
	e.u32(fid)
	e.u32(noFid)
	e.str(uname)
	e.str(c.aname)
	e.u32(uid)
	d, err := c.rpc(tAttach, e.b)
	if err != nil {
		c.putFid(fid)
		return 0, err
	}
	d.qid()
	if d.err != nil {
		c.fail(errProto)
		return 0, errLost
	}
	return fid, nil
}

// twalk walks fid to newfid by names (at most maxWelem).
func (c *conn) twalk(fid, newfid uint32, names []string) ([]qid, error) {
	var e enc
	e.u32(fid)
	e.u32(newfid)
	e.u16(uint16(len(names)))
	for _, n := range names {
		e.str(n)
	}
	d, err := c.rpc(tWalk, e.b)
	if err != nil {
		return nil, err
	}
	qs := make([]qid, d.u16())
	for i := range qs {
		qs[i] = d.qid()
	}
	if d.err != nil || len(qs) > len(names) {
		c.fail(errProto)
		return nil, errLost
	}
	return qs, nil
}

// walk returns a new fid for names beneath fid (a clone for none) and
// the QID of the last name.
func (c *conn) walk(fid uint32, names []string) (uint32, qid, error) {
	nf := c.newFid()
	src := fid
	var last qid
	for first := true; first || len(names) > 0; first = false {
		k := min(len(names), maxWelem)
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
			return 0, qid{}, err
		}
		if k > 0 {
			last = qs[k-1]
		}
		names = names[k:]
		src = nf
	}
	return nf, last, nil
}

func (c *conn) getattr(fid uint32) (rattr, error) {
	var e enc
	e.u32(fid)
	e.u64(getattrAll)
	d, err := c.rpc(tGetattr, e.b)
	if err != nil {
		return rattr{}, err
	}
	r := d.getattr()
	if d.err != nil {
		c.fail(errProto)
		return rattr{}, errLost
	}
	return r, nil
}

// lopen opens fid with 9P2000.L flags and returns its iounit.
func (c *conn) lopen(fid, flags uint32) (uint32, error) {
	var e enc
	e.u32(fid)
	e.u32(flags)
	d, err := c.rpc(tLopen, e.b)
	if err != nil {
		return 0, err
	}
	d.qid()
	return d.u32(), nil
}

// ioSize is how many bytes one Tread or Twrite on a fid with iounit moves.
func (c *conn) ioSize(iounit uint32) int {
	n := c.msize - ioHdrLen
	if iounit != 0 && iounit < n {
		n = iounit
	}
	return int(n)
}

func (c *conn) readAt(fid uint32, iounit uint32, dest []byte, off int64) (int, error) {
	total := 0
	for total < len(dest) {
		want := min(len(dest)-total, c.ioSize(iounit))
		var e enc
		e.u32(fid)
		e.u64(uint64(off) + uint64(total))
		e.u32(uint32(want))
		d, err := c.rpc(tRead, e.b)
		if err != nil {
			return total, err
		}
		n := int(d.u32())
		if d.err != nil || n > want || n > len(d.b) {
			c.fail(errProto)
			return total, errLost
		}
		copy(dest[total:], d.b[:n])
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
		var e enc
		e.u32(fid)
		e.u64(uint64(off) + uint64(total))
		e.bytes(chunk)
		d, err := c.rpc(tWrite, e.b)
		if err != nil {
			return total, err
		}
		n := int(d.u32())
		if d.err != nil || n > len(chunk) {
			c.fail(errProto)
			return total, errLost
		}
		total += n
		if total >= len(data) || n < len(chunk) {
			return total, nil
		}
	}
}
