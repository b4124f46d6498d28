package session

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/p9wire"
)

// Conn is one 9P connection: requests are tagged and may be in flight
// together; one goroutine reads the replies. Fids belong to a connection
// and die with it.
type Conn struct {
	nc      net.Conn
	msize   uint32
	timeout time.Duration
	aname   string
	log     *slog.Logger
	onDead  func(*Conn)
	ctr     *Counters

	wmu sync.Mutex // one message on the wire at a time

	mu      sync.Mutex
	pending map[uint16]chan reply
	nextTag uint16
	nextFid uint32
	freeFid []uint32
	roots   map[uint32]*root // the attach of each Cred, by number (Who)
	noCreds atomic.Bool      // the server does not speak the credentials protocol
	caps    atomic.Uint32    // what the server said it does beyond 9P2000.L (SetCaps)
	dead    chan struct{}    // closed when the connection failed
	err     error
	maxIdle int       // idle fids kept (see Fid)
	idle    list.List // the idle fids, least recently used first
}

type reply struct {
	typ  uint8
	body []byte
}

// root is a Cred's attach, made on its first request.
type root struct {
	done chan struct{}
	fid  uint32
	err  error
}

// ConnOptions are a connection's settings.
type ConnOptions struct {
	Msize   uint32        // the largest message asked for
	Timeout time.Duration // bounds every request but Wait's
	Aname   string        // the tree Root attaches
	MaxIdle int           // idle fids kept (Fid)
	Log     *slog.Logger
	Ctr     *Counters
	OnDead  func(*Conn) // told once when the connection fails
}

// NewConn negotiates the version on nc and starts reading replies.
func NewConn(nc net.Conn, o ConnOptions) (*Conn, error) {
	c := &Conn{nc: nc, msize: o.Msize, timeout: o.Timeout, aname: o.Aname, maxIdle: o.MaxIdle, log: o.Log, ctr: o.Ctr, onDead: o.OnDead,
		pending: map[uint16]chan reply{}, roots: map[uint32]*root{}, nextFid: 1, dead: make(chan struct{})}
	// Tversion before the reader starts: it is the one request alone on
	// the wire, and a server that never answers must not hang us.
	nc.SetDeadline(time.Now().Add(o.Timeout))
	if _, err := nc.Write(p9wire.Encode(&p9wire.VersionReq{Msize: o.Msize, Version: p9wire.Version}, p9wire.NoTag)); err != nil {
		return nil, versionErr(err, o.Timeout)
	}
	h, body, err := p9wire.ReadFrame(nc, 1<<16)
	if err != nil {
		return nil, versionErr(err, o.Timeout)
	}
	d := p9wire.Dec{B: body}
	if h.Type == p9wire.Rlerror {
		var r p9wire.ErrorReply
		r.Decode(&d)
		return nil, fmt.Errorf("refused version %s (%v): shale needs a 9P2000.L server, such as shale serve or diod", p9wire.Version, syscall.Errno(r.Ecode))
	}
	var r p9wire.VersionReply
	r.Decode(&d)
	if h.Type != r.Type() || d.Err != nil {
		return nil, fmt.Errorf("answered the version request with something that is not 9P: is it a 9P server, and does it need a key (?keyfile=FILE)?")
	}
	if r.Version != p9wire.Version {
		return nil, fmt.Errorf("speaks %q, not %s: shale needs a 9P2000.L server, such as shale serve or diod", r.Version, p9wire.Version)
	}
	c.msize = min(c.msize, r.Msize)
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

func (c *Conn) write(m p9wire.Message, tag uint16) error {
	f := p9wire.Encode(m, tag)
	c.ctr.Sent.Add(uint64(len(f)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(f)
	return err
}

func (c *Conn) read() {
	r := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		h, body, err := p9wire.ReadFrame(r, c.msize)
		if err != nil {
			c.Fail(err)
			return
		}
		c.ctr.Recv.Add(uint64(p9wire.HdrLen + len(body)))
		c.mu.Lock()
		ch := c.pending[h.Tag]
		delete(c.pending, h.Tag)
		c.mu.Unlock()
		if ch == nil {
			c.Fail(p9wire.ErrProto) // a tag we never sent: the stream is not ours
			return
		}
		ch <- reply{h.Type, body}
	}
}

// Fail ends the connection: every request in flight and every later one
// gets ErrLost, and its session dials again.
func (c *Conn) Fail(err error) {
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

// SetCaps records what the server said it does beyond 9P2000.L (its
// journal tree's capability bits); Caps is 0 until then.
func (c *Conn) SetCaps(v uint32) { c.caps.Store(v) }

// Caps is what SetCaps recorded.
func (c *Conn) Caps() uint32 { return c.caps.Load() }

// Alive tells whether the connection still serves.
func (c *Conn) Alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// Dead is closed when the connection fails.
func (c *Conn) Dead() <-chan struct{} { return c.dead }

// Close ends the connection on the client's behalf.
func (c *Conn) Close() { c.Fail(errClosed) }

// RPC sends req and decodes its reply into rep. A server error is a
// syscall.Errno; anything else means the connection failed (ErrLost).
// There is no Tflush: a request that gets no reply within the timeout
// fails, and so does its connection, which is closed so that every other
// request in flight fails at once instead of waiting for its own timeout.
//
// At the debug level each request is logged, with its reply's error: the
// trace to count and explain a workload's round trips by.
func (c *Conn) RPC(req, rep p9wire.Message) error {
	c.ctr.Reqs[req.Type()].Add(1)
	err := c.call(req, rep, c.timeout)
	c.logged(req, err)
	return err
}

// logged logs req at the debug level, with its reply's error.
func (c *Conn) logged(req p9wire.Message, err error) {
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		c.log.Debug("9p request", "req", describe(req), "err", err)
	}
}

// Pipe is RPC for several requests, sent together, each answered into
// its reply: one round trip, where the server keeps the order of a fid's
// requests (the caller checks it says so: Caps). The errors are each
// request's.
func (c *Conn) Pipe(reqs, reps []p9wire.Message) []error {
	errs := make([]error, len(reqs))
	calls := make([]*pending, len(reqs))
	c.ctr.Piped.Add(uint64(len(reqs) - 1))
	for i, req := range reqs {
		c.ctr.Reqs[req.Type()].Add(1)
		calls[i], errs[i] = c.start(req, c.timeout)
	}
	for i, k := range calls {
		if k != nil {
			errs[i] = c.finish(k, reps[i])
		}
		c.logged(reqs[i], errs[i])
	}
	return errs
}

// describe is req for the debug log: its type and fields, a write's
// length in place of its data.
func describe(req p9wire.Message) string {
	if w, ok := req.(*p9wire.Write); ok {
		return fmt.Sprintf("Write{Fid:%d Offset:%d Len:%d}", w.Fid, w.Offset, len(w.Data))
	}
	return strings.Replace(strings.TrimPrefix(fmt.Sprintf("%T%+v", req, req), "*p9wire."), "&{", "{", 1)
}

// Do is RPC for the requests answered by success alone.
func (c *Conn) Do(req p9wire.Message) error {
	return c.RPC(req, &p9wire.NoReply{T: req.Type()})
}

// Wait is RPC without a timeout, not counted: the journal's read, which
// blocks on the server until there is something to read.
func (c *Conn) Wait(req, rep p9wire.Message) error { return c.call(req, rep, 0) }

func (c *Conn) call(req, rep p9wire.Message, timeout time.Duration) error {
	k, err := c.start(req, timeout)
	if err != nil {
		return err
	}
	return c.finish(k, rep)
}

// pending is a request sent, its reply to come.
type pending struct {
	ch    chan reply
	timer *time.Timer // fails the connection if the reply is late
}

// start sends req.
func (c *Conn) start(req p9wire.Message, timeout time.Duration) (*pending, error) {
	k := &pending{ch: make(chan reply, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, ErrLost
	}
	tag, ok := c.tag()
	if !ok {
		c.mu.Unlock()
		return nil, syscall.EAGAIN
	}
	c.pending[tag] = k.ch
	c.mu.Unlock()
	if timeout > 0 {
		k.timer = time.AfterFunc(timeout, func() { c.Fail(errTimeout) })
	}
	if err := c.write(req, tag); err != nil {
		c.Fail(err)
		k.stop()
		return nil, ErrLost
	}
	return k, nil
}

func (k *pending) stop() {
	if k.timer != nil {
		k.timer.Stop()
	}
}

// finish waits for k's reply and decodes it into rep.
func (c *Conn) finish(k *pending, rep p9wire.Message) error {
	defer k.stop()
	var r reply
	select {
	case r = <-k.ch:
	case <-c.dead:
		select {
		case r = <-k.ch: // it made it before the end
		default:
			return ErrLost
		}
	}
	d := &p9wire.Dec{B: r.body}
	switch r.typ {
	case p9wire.Rlerror:
		var e p9wire.ErrorReply
		if e.Decode(d); d.Err != nil {
			c.Fail(p9wire.ErrProto)
			return ErrLost
		}
		return syscall.Errno(e.Ecode)
	case rep.Type():
		if rep.Decode(d); d.Err == nil {
			return nil
		}
	}
	c.Fail(p9wire.ErrProto)
	return ErrLost
}

// tag finds a free tag; c.mu is held.
func (c *Conn) tag() (uint16, bool) {
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

// NewFid is a fid number no fid of the connection has.
func (c *Conn) NewFid() uint32 {
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

// PutFid frees a fid number the server does not hold (its request
// failed).
func (c *Conn) PutFid(f uint32) {
	c.mu.Lock()
	c.freeFid = append(c.freeFid, f)
	c.mu.Unlock()
}

// Clunk releases fid; the server forgets it even when it answers an
// error, which then is the error of the operation clunk completes
// (Txattrcreate's).
func (c *Conn) Clunk(fid uint32) error {
	err := c.Do(&p9wire.FidReq{T: p9wire.Tclunk, Fid: fid})
	if err == nil || errors.As(err, new(syscall.Errno)) {
		c.PutFid(fid)
	}
	return err
}

// Walk returns a new fid for names beneath fid (a clone for none) and
// the QID of the last name.
func (c *Conn) Walk(fid uint32, names []string) (uint32, p9wire.Qid, error) {
	nf := c.NewFid()
	src := fid
	var last p9wire.Qid
	for first := true; first || len(names) > 0; first = false {
		k := min(len(names), p9wire.MaxWelem)
		var r p9wire.WalkReply
		err := c.RPC(&p9wire.Walk{Fid: src, NewFid: nf, Names: names[:k]}, &r)
		if err == nil && len(r.Qids) > k {
			c.Fail(p9wire.ErrProto)
			err = ErrLost
		}
		if err == nil && len(r.Qids) < k {
			err = syscall.ENOENT // a partial walk: the name after the last QID is missing
		}
		if err != nil {
			if src == nf {
				c.Clunk(nf)
			} else {
				c.PutFid(nf)
			}
			return 0, p9wire.Qid{}, err
		}
		if k > 0 {
			last = r.Qids[k-1]
		}
		names = names[k:]
		src = nf
	}
	return nf, last, nil
}

// Getattr is fid's attributes, all the server has.
func (c *Conn) Getattr(fid uint32) (p9wire.Rattr, error) {
	var r p9wire.Rattr
	err := c.RPC(&p9wire.Getattr{Fid: fid, Mask: p9wire.GetattrAll}, &r)
	return r, err
}

// Lopen opens fid with 9P2000.L flags and returns its QID and iounit.
func (c *Conn) Lopen(fid, flags uint32) (p9wire.Qid, uint32, error) {
	r := p9wire.OpenReply{T: p9wire.Tlopen}
	err := c.RPC(&p9wire.Lopen{Fid: fid, Flags: flags}, &r)
	return r.Qid, r.Iounit, err
}

// Ride is a request sent behind an open, in its round trip (WalkOpen):
// Make builds it for the connection and the new fid. Once the open
// succeeded, Sent is true and Err is the request's error; else the
// caller sends it itself, if it still wants to.
type Ride struct {
	Make func(c *Conn, fid uint32) (req, rep p9wire.Message)
	Sent bool
	Err  error
}

// WalkOpen is Walk of fid with no names (a clone) and Lopen of the new
// fid with flags, and ride if not nil, sent together (Pipe: for a server
// that keeps the order of a fid's requests). If the walk fails there is
// no new fid (nf is 0); if the open fails, nf is the walked fid, for the
// caller to clunk or open again.
func (c *Conn) WalkOpen(fid, flags uint32, ride *Ride) (nf uint32, q p9wire.Qid, iounit uint32, err error) {
	o := p9wire.OpenReply{T: p9wire.Tlopen}
	open := &Ride{Make: func(_ *Conn, nf uint32) (p9wire.Message, p9wire.Message) {
		return &p9wire.Lopen{Fid: nf, Flags: flags}, &o
	}}
	rides := []*Ride{open}
	if ride != nil {
		rides = append(rides, ride)
	}
	if nf, _, err = c.WalkAnd(fid, nil, rides...); nf == 0 {
		return 0, q, 0, err
	}
	if ride != nil && open.Err != nil {
		ride.Sent, ride.Err = false, nil // it met no open file
	}
	return nf, o.Qid, o.Iounit, open.Err
}

// WalkAnd is Walk of fid to names (at most MaxWelem; none for a
// clone), with the rides' requests on the new fid sent in the same round
// trip (Pipe: for a server that keeps the order of a fid's requests). If
// the walk fails there is no new fid: nf is 0, err the walk's error, and
// no ride is Sent. Else q is the last name's QID and each ride is Sent,
// with its error.
func (c *Conn) WalkAnd(fid uint32, names []string, rides ...*Ride) (nf uint32, q p9wire.Qid, err error) {
	nf = c.NewFid()
	var w p9wire.WalkReply
	reqs := []p9wire.Message{&p9wire.Walk{Fid: fid, NewFid: nf, Names: names}}
	reps := []p9wire.Message{&w}
	for _, r := range rides {
		req, rep := r.Make(c, nf)
		reqs, reps = append(reqs, req), append(reps, rep)
	}
	errs := c.Pipe(reqs, reps)
	switch {
	case errs[0] != nil:
		for _, e := range errs[1:] {
			if e == nil {
				c.Fail(p9wire.ErrProto) // a request on a fid that was not made
				errs[0] = ErrLost
			}
		}
	case len(w.Qids) > len(names):
		c.Fail(p9wire.ErrProto)
		errs[0] = ErrLost
	case len(w.Qids) < len(names):
		errs[0] = syscall.ENOENT // a partial walk: the name after the last QID is missing
	}
	if errs[0] != nil {
		c.PutFid(nf)
		return 0, q, errs[0]
	}
	for i, r := range rides {
		r.Sent, r.Err = true, errs[i+1]
	}
	if len(names) > 0 {
		q = w.Qids[len(names)-1]
	}
	return nf, q, nil
}

// SetMtime sets fid's modification time to t, and reports whether the
// server did.
func (c *Conn) SetMtime(fid uint32, t time.Time) bool {
	return c.Do(&p9wire.Setattr{Fid: fid, Valid: p9wire.SetattrMtime | p9wire.SetattrMtimeSet,
		Mtime: uint64(t.Unix()), MtimeNsec: uint64(t.Nanosecond())}) == nil
}

// Xattrwalk opens name's value (the list of names for "") on a new fid
// and returns its size.
func (c *Conn) Xattrwalk(fid uint32, name string) (uint32, uint64, error) {
	nf := c.NewFid()
	var r p9wire.XattrwalkReply
	if err := c.RPC(&p9wire.Xattrwalk{Fid: fid, NewFid: nf, Name: name}, &r); err != nil {
		c.PutFid(nf)
		return 0, 0, err
	}
	return nf, r.Size, nil
}

// Lock sends Tlock, never asking the server to block (a request must not
// wait there), and returns its status.
func (c *Conn) Lock(fid uint32, typ uint8, start, length uint64, proc uint32, client string) (uint8, error) {
	var r p9wire.LockReply
	if err := c.RPC(&p9wire.Lock{Fid: fid, LockType: typ, Start: start, Length: length, ProcID: proc, ClientID: client}, &r); err != nil {
		return p9wire.LockError, err
	}
	return r.Status, nil
}

// IOSize is how many bytes one Tread or Twrite on a fid with iounit
// moves.
func (c *Conn) IOSize(iounit uint32) int {
	n := c.msize - p9wire.IOHdrLen
	if iounit != 0 && iounit < n {
		n = iounit
	}
	return int(n)
}

// ReadAt reads dest at off of fid, in as many Treads as it takes; short
// at the end of the file, or of what the server had.
func (c *Conn) ReadAt(fid uint32, iounit uint32, dest []byte, off int64) (int, error) {
	total := 0
	for total < len(dest) {
		want := min(len(dest)-total, c.IOSize(iounit))
		r := p9wire.DataReply{T: p9wire.Tread}
		if err := c.RPC(&p9wire.Read{T: p9wire.Tread, Fid: fid, Offset: uint64(off) + uint64(total), Count: uint32(want)}, &r); err != nil {
			return total, err
		}
		if len(r.Data) > want {
			c.Fail(p9wire.ErrProto)
			return total, ErrLost
		}
		copy(dest[total:], r.Data)
		total += len(r.Data)
		if len(r.Data) < want {
			break
		}
	}
	return total, nil
}

// WriteAt writes data at off of fid, in as many Twrites as it takes.
func (c *Conn) WriteAt(fid uint32, iounit uint32, data []byte, off int64) (int, error) {
	total := 0
	for {
		chunk := data[total:min(len(data), total+c.IOSize(iounit))]
		var r p9wire.WriteReply
		if err := c.RPC(&p9wire.Write{Fid: fid, Offset: uint64(off) + uint64(total), Data: chunk}, &r); err != nil {
			return total, err
		}
		n := int(r.Count)
		if n > len(chunk) {
			c.Fail(p9wire.ErrProto)
			return total, ErrLost
		}
		total += n
		if total >= len(data) || n < len(chunk) {
			return total, nil
		}
	}
}
