// Package export serves nodes of a shale stack over 9P2000.L, on the
// library github.com/hugelgupf/p9: the 9P twin of fuseview.
//
// Each connection gets its own p9.Server, because the library's Attacher
// takes no arguments: the connection's Attacher returns a synthetic
// directory whose only names are identity names (p9net.IdentityName), which
// p9net.ServerStream puts in front of every Tattach's attach name. Below an
// identity, a walk reaches the roots by attach name, and every File it
// makes carries that caller (layer.Caller with Check set: no kernel has
// checked permissions, the bottom of the stack must).
//
// The server is hugelgupf/p9 v0.3.0's, copied into internal/p9 with fixes
// (see its doc.go): upstream could panic when a connection ended with
// requests in flight, and closed directory files still in use after an
// xattr fid. What it still leaves out: Tgetlock (F_GETLK) is answered
// ENOSYS; a failed Txattrwalk is always EINVAL; an empty xattr list reads
// as one empty name; a message larger than msize ends the connection; the
// uid of its Tucreate & co (9P2000.L.Google) is ignored here: files
// belong to the attaching caller.
package export

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/stack"
)

// Options tune a Server.
type Options struct {
	// NoRootSquash lets uid 0 of clients act as root; otherwise it acts as
	// 65534 (gid 65534).
	NoRootSquash bool
	// MaxConns bounds concurrent connections (0: 64); excess connections
	// are closed at once.
	MaxConns int
	// MaxFids bounds the files the server holds per connection (0: 4096):
	// fids, and the directories the library keeps for multi-name walks.
	// Walks past it fail with EMFILE.
	MaxFids int
	// Logger gets the library's complaints (nil: slog.Default()).
	Logger *slog.Logger
}

// Server serves a set of roots over 9P.
type Server struct {
	st    *stack.Stack
	opts  Options
	log   *slog.Logger
	roots map[string]*root
	// prefixes are the proper prefixes of root names with a '/' in them:
	// the synthetic directories above those roots.
	prefixes map[string][]string

	slots    chan struct{} // MaxConns tokens
	requests atomic.Uint64
	nextConn atomic.Uint64

	usersMu sync.Mutex
	users   map[uint32]groups

	mu    sync.Mutex
	conns map[*conn]struct{}
}

// root is one served node under its attach name.
type root struct {
	name string
	n    layer.Node
	view uint32 // in the stack's coherence manager; 0 without one
}

// groups are a uid's groups from the user database.
type groups struct {
	gid  uint32
	supp []uint32
}

// nobody is who a squashed root and unknown clients act as.
const nobody = p9net.Nobody

// New serves roots by attach name; "" is the default root, which also
// answers to "/". Names may hold '/' (leading and trailing ones are
// dropped): the components above a root are synthetic directories. A
// root's name shadows a same-named entry at the top of the default root,
// as a mount would. The roots stay the caller's: the server never Forgets
// them.
func New(st *stack.Stack, roots map[string]layer.Node, opts Options) *Server {
	if opts.MaxConns <= 0 {
		opts.MaxConns = 64
	}
	if opts.MaxFids <= 0 {
		opts.MaxFids = 4096
	}
	s := &Server{
		st: st, opts: opts, log: opts.Logger,
		roots:    map[string]*root{},
		prefixes: map[string][]string{},
		slots:    make(chan struct{}, opts.MaxConns),
		users:    map[uint32]groups{},
		conns:    map[*conn]struct{}{},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	for name, n := range roots {
		name = strings.Trim(name, "/")
		r := &root{name: name, n: n}
		// The export holds no cache yet: 9P clients are told nothing
		// (9P2000.L has no invalidation; that waits for the journal), so
		// Invalidate drops nothing. Registering still gives the export a
		// view number, so that FUSE views of the same stack hear of
		// changes made over 9P.
		if m := st.Manager(); m != nil {
			r.view = m.Register(holder{}, n)
		}
		s.roots[name] = r
	}
	for name := range s.roots {
		for i := 0; i < len(name); i++ {
			if name[i] == '/' {
				p := name[:i]
				s.prefixes[p] = append(s.prefixes[p], name)
			}
		}
	}
	return s
}

// holder is the export as a coherence holder; see New.
type holder struct{}

func (holder) Invalidate(layer.Event) {}

// Requests returns how many 9P requests the server has read so far.
func (s *Server) Requests() uint64 { return s.requests.Load() }

// Serve accepts connections on l until ctx ends (it then returns nil) or
// l fails. On return every connection is closed and every fid, open
// handle and lock they held is released.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() {
		l.Close()
		s.closeAll()
	})
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Connections accepted so far end with Serve.
			s.closeAll()
			return err
		}
		wg.Go(func() { s.serve(ctx, c) })
	}
}

// closeAll closes every connection being served; their ServeConn then
// releases what they hold.
func (s *Server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.rw.Close()
	}
}

// ServeConn serves one connection and returns when it ends, having
// released everything the connection held.
func (s *Server) ServeConn(c io.ReadWriteCloser) { s.serve(context.Background(), c) }

func (s *Server) serve(ctx context.Context, rw io.ReadWriteCloser) {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		s.log.Warn("9p: too many connections; closing one", "max", s.opts.MaxConns)
		rw.Close()
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &conn{s: s, id: s.nextConn.Add(1), rw: rw, ctx: ctx, nodes: map[nodeKey]*nodeRec{}, files: map[*file]struct{}{}}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	// Serve may have closed every connection between our accept and now.
	if ctx.Err() != nil {
		rw.Close()
	}
	// A p9.Server per connection: its Attacher is the only way to tell
	// the files of one connection from another's. Renames are serialized
	// per connection only; the layers order concurrent changes as they
	// do for FUSE views.
	srv := p9.NewServer(attacher{c}, p9.WithServerLogger(logAdapter{s.log}))
	t := &traffic{rw: rw, total: &s.requests, limit: maxMessage}
	srv.Handle(p9net.ServerStream(t), t)
	// Handle has clunked every fid; files the library lost count of (see
	// taint) or still holds for other reasons go now.
	c.releaseAll()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// frames counts the 9P messages of a byte stream by their size fields.
type frames struct {
	hdr  [4]byte
	have int   // bytes of hdr seen
	left int64 // bytes of the current message after hdr
}

const (
	tversion   = 100
	headerLen  = 7
	maxMessage = 4 << 20 // the library's largest message
)

func (c *frames) count(b []byte) (n uint64) {
	for len(b) > 0 {
		if c.left > 0 {
			m := min(int64(len(b)), c.left)
			c.left -= m
			b = b[m:]
			continue
		}
		m := copy(c.hdr[c.have:], b)
		c.have += m
		b = b[m:]
		if c.have == len(c.hdr) {
			n++
			c.have = 0
			c.left = max(int64(binary.LittleEndian.Uint32(c.hdr[:]))-int64(len(c.hdr)), 0)
		}
	}
	return n
}

// traffic is a connection's stream, seen from both ends: the requests
// given to the library (and counted in the server's total) and the replies
// written.
type traffic struct {
	rw    io.ReadWriteCloser
	total *atomic.Uint64

	rbuf  [64 << 10]byte
	buf   []byte // read from rw, not yet given to the library
	rerr  error  // what rw's last read returned, once buf is given
	cur   int64  // bytes of the current request still to give
	wait  bool   // hold the next request until all are answered
	limit uint32 // the smallest msize a Tversion asked for, or maxMessage

	started, answered atomic.Uint64
	out               frames
	deaf              atomic.Bool // a reply failed: none will be answered
}

// drainWait bounds how long a request waits for the ones before it.
const drainWait = 10 * time.Second

// Read gives the library the client's requests, but holds back some until
// every request before has been answered (quiesce), to keep clear of two
// races in hugelgupf/p9 v0.3.0 (server.go) that only it can fix:
//
//   - it starts a goroutine for the next request before it counts it in
//     the WaitGroup its shutdown waits on, and panics if the count rises
//     again as that wait ends: so the connection's end, and a request that
//     ends it (larger than msize, or too short), wait;
//   - a Tversion replaces buffers that requests in flight use: so it waits
//     for them, and the next request for it.
func (t *traffic) Read(p []byte) (int, error) {
	if t.cur == 0 {
		for len(t.buf) < headerLen && t.rerr == nil {
			t.fill()
		}
		if len(t.buf) < headerLen {
			t.quiesce()
			if len(t.buf) == 0 {
				return 0, t.rerr
			}
			n := copy(p, t.buf)
			t.buf = t.buf[n:]
			return n, nil
		}
		size, typ := binary.LittleEndian.Uint32(t.buf), t.buf[4]
		if t.wait || typ == tversion || size < headerLen || size > t.limit {
			t.quiesce()
		}
		t.wait = typ == tversion
		if typ == tversion && size >= 11 {
			for len(t.buf) < 11 && t.rerr == nil {
				t.fill()
			}
			if len(t.buf) >= 11 {
				if m := binary.LittleEndian.Uint32(t.buf[7:]); m > 0 && m < t.limit {
					t.limit = m
				}
			}
		}
		t.cur = int64(max(size, headerLen))
		t.started.Add(1)
		t.total.Add(1)
	}
	p = p[:min(int64(len(p)), t.cur)]
	if len(t.buf) > 0 {
		n := copy(p, t.buf)
		t.buf = t.buf[n:]
		t.cur -= int64(n)
		return n, nil
	}
	if t.rerr != nil {
		t.quiesce()
		return 0, t.rerr
	}
	n, err := t.rw.Read(p)
	t.cur -= int64(n)
	if err != nil {
		t.rerr = err
		if n == 0 {
			t.quiesce()
			return 0, err
		}
	}
	return n, nil
}

// fill reads more of the stream after what buf holds.
func (t *traffic) fill() {
	k := copy(t.rbuf[:], t.buf)
	n, err := t.rw.Read(t.rbuf[k:])
	t.buf = t.rbuf[:k+n]
	if err != nil {
		t.rerr = err
	}
}

// quiesce waits until every request given so far has been answered, and
// a moment more for the library's goroutines to be counted.
func (t *traffic) quiesce() {
	for deadline := time.Now().Add(drainWait); t.answered.Load() < t.started.Load() && !t.deaf.Load() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
}

func (t *traffic) Write(p []byte) (int, error) {
	k, err := t.rw.Write(p)
	t.answered.Add(t.out.count(p[:k]))
	if err != nil {
		t.deaf.Store(true)
	}
	return k, err
}

func (t *traffic) Close() error { return t.rw.Close() }

// logAdapter passes the library's log lines to slog: handler panics (which
// it turns into EFAULT) as errors, the rest (closed connections, bad
// messages) at debug level.
type logAdapter struct{ l *slog.Logger }

func (a logAdapter) Printf(format string, v ...any) {
	if strings.HasPrefix(format, "panic") {
		a.l.Error("9p: "+format, "args", v)
		return
	}
	a.l.Debug("9p: "+format, "args", v)
}

func (a logAdapter) Print(v ...any) { a.l.Debug("9p", "args", v) }

// caller is who a connection's attach named, as the layers see them.
func (s *Server) caller(uid uint32) layer.Caller {
	if uid == 0 && !s.opts.NoRootSquash {
		return layer.Caller{Uid: nobody, Gid: nobody, Supp: []uint32{}, Check: true}
	}
	g := s.groupsOf(uid)
	return layer.Caller{Uid: uid, Gid: g.gid, Supp: g.supp, Check: true}
}

// groupsOf looks uid up in the user database, once: a uid it does not
// know has its own number as gid and no supplementary groups.
func (s *Server) groupsOf(uid uint32) groups {
	s.usersMu.Lock()
	g, ok := s.users[uid]
	s.usersMu.Unlock()
	if ok {
		return g
	}
	g = groups{gid: uid, supp: []uint32{}}
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if n, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			g.gid = uint32(n)
		}
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if n, err := strconv.ParseUint(id, 10, 32); err == nil {
					g.supp = append(g.supp, uint32(n))
				}
			}
		}
	}
	s.usersMu.Lock()
	s.users[uid] = g
	s.usersMu.Unlock()
	return g
}
