package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
)

// Backoff of the redial: 100 ms doubling to 5 s.
const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

// Session is a client's one connection at a time to its server: when
// the connection fails it dials again in the background, with backoff,
// and runs the steps on the new one, in order, before anything else is
// asked on it (the journal, then the reclaim of delayed writes: what
// the server must know before it answers anyone). A request made while
// there is no connection waits for one up to the timeout.
//
// What else a connection had is made again lazily, as it is used, so that
// a reconnection costs what is used and not what is known: a uid attaches
// at its first request (Conn.Root), a node walks a new fid by its path,
// an open file opens again (remote's node and handle).
type Session struct {
	dial  func(ctx context.Context) (net.Conn, error)
	o     ConnOptions
	log   *slog.Logger
	steps []step
	lost  []func(*Conn)

	mu      sync.Mutex
	cur     *Conn         // nil while disconnected
	ready   chan struct{} // closed when cur is set again
	dialing bool
	closed  bool
}

type step struct {
	what string // for errors: "while opening the journal"
	run  func(*Conn) error
}

// New makes a session that dials with dial; o.OnDead is its own.
func New(dial func(ctx context.Context) (net.Conn, error), o ConnOptions) *Session {
	s := &Session{dial: dial, o: o, log: o.Log, ready: make(chan struct{})}
	s.o.OnDead = s.connLost
	return s
}

// Then adds a step every new connection runs, after those added before,
// before it serves; what names it in errors ("opening the journal"). An
// error of a step ends the connection: the dial is tried again. Steps
// are added before Start.
func (s *Session) Then(what string, run func(*Conn) error) {
	s.steps = append(s.steps, step{what, run})
}

// OnLost adds a function told of each lost connection, before the
// redial starts. Added before Start.
func (s *Session) OnLost(f func(*Conn)) { s.lost = append(s.lost, f) }

// Timeout bounds every request, and the wait for a connection.
func (s *Session) Timeout() time.Duration { return s.o.Timeout }

// Start makes the first connection, or says why it cannot: its error
// follows "9p server at ADDR ".
func (s *Session) Start(ctx context.Context) (*Conn, error) {
	c, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.Alive() {
		// Lost after its steps, before it was published: its loss was
		// not this session's to see (connLost found cur not it).
		return nil, fmt.Errorf("lost the connection as it was made: is it running?")
	}
	s.cur = c
	close(s.ready)
	return c, nil
}

// connect dials, negotiates and runs the steps.
func (s *Session) connect(ctx context.Context) (*Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	nc, err := s.dial(dctx)
	if err != nil {
		if errors.Is(err, p9net.ErrAuth) {
			return nil, fmt.Errorf("refused the key: %v", err)
		}
		if u := errors.Unwrap(err); u != nil {
			err = u // p9net's "connect to ADDR" says again where
		}
		return nil, fmt.Errorf("cannot be reached (%v): is it running, and is the address right?", err)
	}
	c, err := NewConn(nc, s.o)
	if err != nil {
		nc.Close()
		return nil, err
	}
	for _, st := range s.steps {
		if err := st.run(c); err != nil {
			c.Close()
			return nil, fmt.Errorf("lost the connection while %s (%v): is it running?", st.what, err)
		}
	}
	return c, nil
}

// connLost is told by c when it fails: the session dials again in the
// background.
func (s *Session) connLost(c *Conn) {
	for _, f := range s.lost {
		f(c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != c {
		return
	}
	s.cur = nil
	s.ready = make(chan struct{})
	if !s.closed && !s.dialing {
		s.dialing = true
		go s.redial()
	}
}

// redial dials until it has a connection or the session is closed.
func (s *Session) redial() {
	wait := backoffMin
	for !s.Closed() {
		c, err := s.connect(context.Background())
		if err == nil && !c.Alive() {
			// Lost between its steps and now (its loss was not ours to
			// see: cur was not it): dial again.
			err = errors.New("lost the connection as it was made")
		}
		if err == nil {
			s.mu.Lock()
			s.dialing = false
			if s.closed {
				s.mu.Unlock()
				c.Close()
				return
			}
			s.cur = c
			close(s.ready)
			s.mu.Unlock()
			s.log.Info("9p connection restored")
			return
		}
		s.log.Debug("9p redial", "err", err, "next", wait)
		time.Sleep(wait)
		wait = min(2*wait, backoffMax)
	}
}

// Live tells whether the session has a connection that has not failed.
func (s *Session) Live() bool {
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	return c != nil && c.Alive()
}

// Closed tells whether Close ended the session.
func (s *Session) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Conn returns the live connection, waiting up to the timeout for one:
// EIO past it or once closed, EINTR if ctx ends first.
func (s *Session) Conn(ctx context.Context) (*Conn, layer.Errno) {
	var timer *time.Timer
	for {
		s.mu.Lock()
		c, ready, closed := s.cur, s.ready, s.closed
		s.mu.Unlock()
		if closed {
			return nil, syscall.EIO
		}
		if c != nil && c.Alive() {
			return c, 0
		}
		if c != nil {
			// It failed: its Fail reports it, unless it has already
			// (connLost is idempotent).
			s.connLost(c)
			continue
		}
		if timer == nil {
			timer = time.NewTimer(s.o.Timeout)
			defer timer.Stop()
		}
		select {
		case <-ready:
		case <-timer.C:
			return nil, syscall.EIO
		case <-ctx.Done():
			return nil, syscall.EINTR
		}
	}
}

// maxResends bounds UntilNotLost: a link that loses every request fails
// the call after as many.
const maxResends = 3

// UntilNotLost runs try again while it says its connection was lost
// under it: the server may have made the request or not, and it is sent
// again on the next connection if one comes within the timeout of the
// loss, as any request waits for one: as often as need be within the
// timeout, and maxResends times past it. So a request that took its
// whole timeout (a stalled link) is sent again too: failed, its program
// would be told of a change that may yet be made. The server fences the
// lost connection when the next opens the client's journal (export), so
// what it held lands before, or never.
func (s *Session) UntilNotLost(ctx context.Context, try func() (lost bool)) {
	deadline := time.Now().Add(s.o.Timeout)
	for n := 0; try(); n++ {
		if ctx.Err() != nil || s.Closed() || n >= maxResends && time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond) // the loss is being reported (Conn.Fail)
		if _, e := s.Conn(ctx); e != 0 {
			return
		}
	}
}

// Close ends the session: its connection, and every request after.
func (s *Session) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	c := s.cur
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
