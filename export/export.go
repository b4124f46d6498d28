// Package export serves nodes of a shale stack over 9P2000.L: the 9P twin
// of fuseview.
//
// It speaks the protocol itself (codec: p9wire), not through a library's
// server: hugelgupf/p9's miscounted the fids of xattr walks (its path tree
// then lost nodes and later walks failed), refused operations on fids of
// unlinked files, answered every failed Txattrwalk EINVAL, lacked Tgetlock
// and could race with itself at a connection's end.
//
// A connection's requests are served at once, each in its own goroutine
// (at most maxInFlight); Tflush cancels one and waits for it. A Tattach
// names who attaches (n_uname, else uname in the user database, else
// nobody), with the gid and groups its afid claims (creds.go) or else the
// user database's, and every fid it leads to carries that caller
// (layer.Caller with Check set: no kernel has checked permissions, the
// bottom of the stack must). Its attach name selects a root, and may go
// on below it. The uid of 9P2000.L.Google's Tucreate & co is not served:
// files belong to the attaching caller.
//
// Lock order. A request holds its fid's mu (fid.go) while it is served;
// of two fids, the one made first is taken first (conn.pair). Under it:
// Server.mu, then conn.mu, then controller.mu, then jrnl.mu; conn.wmu,
// then conn.mu or jrnl.mu (conn.send); sprite.mu, then jrnl.mu or
// rights.mu; rights.wmu, then rights.mu. conn.mu is held across the
// coherence manager's Register (conn.viewOf). Leaves, under which
// nothing is taken: jrnl.mu, rights.mu, order.mu, Server.usersMu,
// squashLog.mu, fileFid.omu, xattrFid.smu; fileFid.smu is taken alone.
// Only a fid's mu and fileFid.smu are held across calls into the layers,
// so the coherence manager's callbacks may come from any request.
// Held across I/O or a long wait: a fid's mu (the layers, Sprite's
// recalls: only that fid's requests wait), conn.wmu (a reply's write,
// bounded by writeTimeout where the stream has deadlines; the reading of
// requests does not take it), rights.wmu (the rights file's writes).
package export

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/stack"
)

// Options tune a Server.
type Options struct {
	// NoRootSquash lets uid 0 of clients act as root; otherwise it acts as
	// 65534 (gid 65534), and group 0 is 65534 too: the primary or a
	// supplementary group of the uid claimed, and the group asked for
	// what a request makes.
	NoRootSquash bool
	// MaxConns bounds the sessions served at once (0: 64): connections
	// that sent their first message. Past it an idle one is closed to
	// make room (admit.go).
	MaxConns int
	// MaxConnsPerPeer bounds the sessions of one peer (p9net.PeerKey: a
	// local user's uid, over a unix socket or keyless loopback TCP; an
	// address over TCP but loopback), 0: MaxConns/2, at least 1.
	MaxConnsPerPeer int
	// Idle is how long a session has had no request (but journal reads)
	// before it may be closed to admit another (0: 2 s).
	Idle time.Duration
	// FirstTimeout bounds the wait for a connection's first message (0:
	// p9net.DefaultAcceptTimeout).
	FirstTimeout time.Duration
	// MaxFids bounds the fids of a connection (0: 4096): walks and
	// attaches past it fail with EMFILE.
	MaxFids int
	// Logger gets the server's complaints (nil: slog.Default()).
	Logger *slog.Logger
	// JournalRecords bounds the records queued in one journal (0:
	// 65536); past it the queue becomes one Reset.
	JournalRecords int
	// MaxJournals bounds the journals (0: 4096): past it the longest
	// abandoned (no connection) are deleted (jbounds.go).
	MaxJournals int
	// JournalBytes bounds one journal's estimated memory, its records and
	// the QIDs it follows (0: 16 MiB); past it the journal is Reset.
	JournalBytes int64
	// JournalMemory bounds all journals' (0: 128 MiB): past it the
	// largest are Reset, abandoned ones first and sooner (jbounds.go).
	JournalMemory int64
	// JournalAge is how long a journal outlives its client's last
	// connection (0: an hour).
	JournalAge time.Duration
	// JournalInterest bounds the QIDs one journal follows (0: a
	// million); past it the journal is Reset.
	JournalInterest int
	// Sprite turns on Sprite's consistency rules (sprite.go): the
	// journal tree says so to clients, which then delay their writes.
	// Off, opens answer version 0 and nothing is recalled.
	Sprite bool
	// Delegate lets Sprite's rules grant read delegations (sprite_deleg.go):
	// a client that takes them opens a file for reading without a Tlopen
	// until the server takes the delegation back.
	Delegate bool
	// RecallTimeout bounds how long an open waits for a connected
	// client to write back a file's dirty data (0: 10 s); past it the
	// open goes on without them, and says so in the log (sprite.go).
	RecallTimeout time.Duration
	// NameWait bounds how long a request that changes names waits for
	// the other clients that cache the directory to apply its record
	// (namewait.go; 0: 1 s; negative: no wait, and a stat on another
	// client may show the old name for one journal delivery).
	NameWait time.Duration
	// Lease is how long a client that lost its connection keeps its
	// claim to dirty data: opens of its files wait that long for it to
	// come back and write them back (0: 20 s).
	Lease time.Duration
	// Grace, after a restart that followed a crash, is how long opens
	// wait for clients to reclaim the dirty data they held (0: none).
	Grace time.Duration
	// RightsFile keeps, on stable storage, which clients may hold
	// delayed writes of which files (rights.go): after a restart only
	// they may reclaim them. "": kept in memory, and no reclaim after a
	// restart is taken.
	RightsFile string
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

	pending  *p9net.Pending // connections before their first message
	requests atomic.Uint64
	nextConn atomic.Uint64
	panics   atomic.Uint64 // requests whose handler panicked (serveOne)
	squashed squashLog     // requests of squashed roots refused (squash.go)
	reaped   atomic.Uint64 // idle sessions closed to admit others
	refused  atomic.Uint64 // connections refused a session
	fences   atomic.Uint64 // connections ended because their client opened its journal on another (fence.go)
	counts   counters
	ctl      *controller
	sp       *sprite
	rights   *rights

	usersMu sync.Mutex
	users   map[uint32]groups

	mu       sync.Mutex
	conns    map[*conn]struct{}
	sessions int              // admitted connections (admit.go)
	peers    map[string]int   // sessions by peer
	waiting  map[*conn]uint64 // connections waiting for a session, by ticket
	tickets  uint64
	// drain is closed when Serve's context ends: connections read no
	// more requests, journal reads end, and the requests in flight finish
	// (within drainTime) before the connections close, so that no client
	// is left not knowing whether a change it asked for was made.
	drain     chan struct{}
	drainOnce sync.Once
}

// root is one served node under its attach name.
type root struct {
	name string
	n    layer.Node
	view uint32 // its journals' holder in the stack's coherence manager
}

// groups are a uid's groups from the user database, as of at.
type groups struct {
	gid  uint32
	supp []uint32
	at   time.Time
}

// The user database is asked again about a uid after usersTTL (groups
// change), and at most maxUsers uids are remembered (clients name any).
const (
	usersTTL = time.Minute
	maxUsers = 1024
)

// nobody is who a squashed root and unknown clients act as.
const nobody = 65534

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
	if opts.MaxConnsPerPeer <= 0 {
		opts.MaxConnsPerPeer = max(opts.MaxConns/2, 1)
	}
	if opts.Idle <= 0 {
		opts.Idle = defaultIdle
	}
	if opts.FirstTimeout <= 0 {
		opts.FirstTimeout = p9net.DefaultAcceptTimeout
	}
	if opts.MaxFids <= 0 {
		opts.MaxFids = 4096
	}
	if opts.JournalRecords <= 0 {
		opts.JournalRecords = defaultJournalRecords
	}
	if opts.MaxJournals <= 0 {
		opts.MaxJournals = defaultMaxJournals
	}
	if opts.JournalBytes <= 0 {
		opts.JournalBytes = defaultJournalBytes
	}
	if opts.JournalMemory <= 0 {
		opts.JournalMemory = defaultJournalMemory
	}
	if opts.JournalAge <= 0 {
		opts.JournalAge = defaultJournalAge
	}
	if opts.JournalInterest <= 0 {
		opts.JournalInterest = defaultJournalInterest
	}
	s := &Server{
		st: st, opts: opts, log: opts.Logger,
		roots:    map[string]*root{},
		prefixes: map[string][]string{},
		pending:  p9net.NewPending(max(2*opts.MaxConns, minPending)),
		peers:    map[string]int{},
		waiting:  map[*conn]uint64{},
		users:    map[uint32]groups{},
		conns:    map[*conn]struct{}{},
		drain:    make(chan struct{}),
		ctl:      newController(&opts),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.sp = newSprite(s, &opts)
	s.rights = openRights(opts.RightsFile, s.log)
	for name, n := range roots {
		name = strings.Trim(name, "/")
		r := &root{name: name, n: n}
		// The root's journals hear of every change, whoever made it, as
		// the root's layer sees it; each connection has views of its own
		// (conn.viewOf), so that a client is not told of its changes.
		if m := st.Manager(); m != nil {
			r.view = m.Register(jholder{s, r}, n)
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

// connView is a connection's view in the coherence manager: it caches
// nothing itself (its journal does, through the root's jholder), but its
// number marks the changes the connection's requests make.
type connView struct{}

func (connView) Invalidate(layer.Event) {}

// Epoch is the number every journal record of this server carries.
func (s *Server) Epoch() uint64 { return s.ctl.epoch }

// Requests returns how many 9P requests the server has read so far.
func (s *Server) Requests() uint64 { return s.requests.Load() }

// Serve accepts connections on l until ctx ends (it then returns nil) or
// l fails. On return every connection is closed and every fid, open
// handle and lock they held is released.
//
// Who a connection's peer is, and so which uids it may attach as, is
// what p9net.PeerOf says of it (p9net.Listen's listeners tell); a
// connection of another listener is vouched for by its owner: it may
// attach as anyone.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.rights.close()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() {
		l.Close()
		s.drainAll()
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
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.rw.Close() // a TLS close may write: not under s.mu, which admission takes
	}
}

// drainTime bounds how long a connection's requests in flight may take
// to finish when Serve ends.
const drainTime = 5 * time.Second

// drainAll stops every connection reading requests; each then finishes
// those in flight (serve) and closes.
func (s *Server) drainAll() {
	s.drainOnce.Do(func() { close(s.drain) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.stopReading()
	}
}

// ServeConn serves one connection and returns when it ends, having
// released everything the connection held.
func (s *Server) ServeConn(c io.ReadWriteCloser) { s.serve(context.Background(), c) }

func (s *Server) serve(ctx context.Context, rw io.ReadWriteCloser) {
	// Not ended with Serve's ctx: a drain ends the connection (drainAll).
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	c := &conn{s: s, id: s.nextConn.Add(1), rw: rw, peer: peerOf(rw), ctx: ctx, stop: cancel, base: context.WithoutCancel(ctx),
		slots: make(chan struct{}, maxInFlight), waiting: make(chan struct{}, maxWaiting), nodes: map[nodeKey]*nodeRec{}, fids: map[uint32]*fid{}, tags: map[uint16]*req{},
		views: map[*root]uint32{}, ended: make(chan struct{})}
	c.msize.Store(maxMsize)
	defer close(c.ended)
	c.peerKey = peerKeyOf(rw)
	readDeadline(rw, time.Now().Add(s.opts.FirstTimeout))
	c.unpend = s.pending.Add(c.peerKey, func() {
		cancel()
		rw.Close()
	})
	defer c.unpend()
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	// Serve may have begun its drain between our accept and now.
	select {
	case <-s.drain:
		c.stopReading()
	default:
	}
	c.loop()
	select {
	case <-s.drain:
		// Requests in flight finish and are answered first.
		done := make(chan struct{})
		go func() { c.flight.Wait(); close(done) }()
		t := time.NewTimer(drainTime)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	default:
	}
	// The stream has ended: requests still running (a layer that hangs)
	// are cancelled, and every fid goes with its handles and locks.
	cancel()
	c.flight.Wait()
	rw.Close()
	c.releaseAll()
	c.endViews()
	s.ctl.detach(c)
	s.mu.Lock()
	delete(s.conns, c)
	s.releaseSessionLocked(c)
	s.mu.Unlock()
}

// caller is who a connection's attach named, as the layers see them,
// with the groups the user database gives them.
func (s *Server) caller(uid uint32) layer.Caller {
	g := s.groupsOf(uid)
	return s.squash(uid, g.gid, g.supp)
}

// squash is the caller uid, gid and supp make, root squashed unless
// NoRootSquash: uid 0 acts as nobody in no group, and group 0 as nobody's.
// supp is not changed (the user database's are shared).
func (s *Server) squash(uid, gid uint32, supp []uint32) layer.Caller {
	if uid == 0 && !s.opts.NoRootSquash {
		return layer.Caller{Uid: nobody, Gid: nobody, Supp: []uint32{}, Check: true, Squashed: true}
	}
	if supp == nil {
		supp = []uint32{} // known: none
	}
	if !s.opts.NoRootSquash && slices.Contains(supp, 0) {
		sq := make([]uint32, len(supp))
		for i, id := range supp {
			sq[i] = s.squashGid(id)
		}
		supp = sq
	}
	return layer.Caller{Uid: uid, Gid: s.squashGid(gid), Supp: supp, Check: true}
}

// squashGid is the group gid acts as: root's is nobody's unless
// NoRootSquash.
func (s *Server) squashGid(gid uint32) uint32 {
	if gid == 0 && !s.opts.NoRootSquash {
		return nobody
	}
	return gid
}

// groupsOf looks uid up in the user database, at most once in usersTTL:
// a uid it does not know has its own number as gid and no supplementary
// groups.
func (s *Server) groupsOf(uid uint32) groups {
	now := time.Now()
	s.usersMu.Lock()
	g, ok := s.users[uid]
	s.usersMu.Unlock()
	if ok && now.Sub(g.at) < usersTTL {
		return g
	}
	g = groups{gid: uid, supp: []uint32{}, at: now}
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
	defer s.usersMu.Unlock()
	if _, ok := s.users[uid]; !ok && len(s.users) >= maxUsers {
		// Full: the expired go, else any (map order is random enough).
		for k, o := range s.users {
			if now.Sub(o.at) >= usersTTL {
				delete(s.users, k)
			}
		}
		for k := range s.users {
			if len(s.users) < maxUsers {
				break
			}
			delete(s.users, k)
		}
	}
	s.users[uid] = g
	return g
}
