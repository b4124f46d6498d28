// Package remote is the bottom of a stack whose lower tree is on a 9P
// server (shale serve, diod, any 9P2000.L server): the remote twin of
// hostfs, a 9P2000.L client behind the layer interface.
//
// Identity: every request runs as the caller its ctx carries
// (layer.Caller; the process's own ids when there is none). The client
// attaches once per set of credentials (uid, gid and supplementary
// groups: session.Cred; the server takes them from shale's credentials
// protocol, others look the uid's groups up themselves), on its first
// request, and a node's fids are per credentials, walked from their
// attach by the node's path, so the server checks permissions as the
// caller and never sees one caller act through another's fid. What the
// cache grants is per uid (the kernel checks the groups above it, with
// default_permissions). New objects get the caller's gid, and a mode
// masked with the caller's umask unless the directory has a default ACL
// (9P has no umask), as hostfs does locally.
//
// Fids: the kernel forgets nodes only under memory pressure, and servers
// bound the fids of a connection (shale serve: --max-fids, 4096), so a
// connection keeps at most 1024 idle node fids, clunking the least
// recently used; their nodes walk again by path when next used. Open
// handles keep their fids, and so do nodes whose name was removed or
// replaced through the client: having no path, they cannot walk again,
// and their fids are checked to reach their file still before each use
// (ESTALE if not: on diod, whose fids are paths, the name's new file).
//
// Caching: with a journal controller on the server (shale serve), the
// client caches attributes, names, listings, symlinks, extended
// attributes and file data and is told of others' changes through its
// journal (callbacks.go, remote/cache; on disk with Options.CacheDir,
// remote/cache/disk.go); their records raise the stack's events. Without one (diod), nothing is cached beyond one request: every
// Getattr is a Tgetattr, every Lookup a Twalk and a Tgetattr. Changes made
// through the client raise the stack's events, as hostfs does, so views
// of one remote lower stay coherent with each other.
//
// Failure: a request without a reply within Options.Timeout fails with
// EIO and closes its connection, so that a dead or stopped server makes
// requests fail rather than hang; every request in flight on a lost
// connection fails with EIO. The client dials again with backoff (100 ms
// doubling to 5 s); a request made while there is no connection waits for
// one up to Timeout, then fails with EIO. Nodes walk their fids again by
// path, and open handles open again (without O_TRUNC, O_CREAT, O_EXCL), on
// their next use. Locks do not survive: see Setlk.
//
// Parts: the 9P session (remote/session: connections, typed requests,
// fids, the redial and its steps), the journal cache (remote/cache) and
// Sprite's write-behind (remote/writeback). Nodes and handles compose
// them: a read is the dirty overlay, then the cache, then the session.
//
// Lock order: handle.reopen, then writeback's open lock and per-file
// locks (see remote/writeback), then handle.mu and node.pinMu; node.pinMu,
// then FS.tree, then FS.liveMu; jreader.mu, then FS.liveMu, then the
// cache's; node.mu, then the connection's. FS.procMu is taken alone.
// Held across a request: handle.reopen (only that handle's requests
// wait), writeback's open lock (only opens of that file) and its per-file
// lock during a write-back (only writes, reads of delayed data and stats
// of that file wait; nothing of the cache's readers, nor a session step).
//
// Extended attributes: 9P2000.L has no removexattr; a Txattrcreate of
// size 0 stands for it, as in the kernel's 9P client. So a Setxattr of an
// empty value with XATTR_REPLACE removes the attribute on the server
// (shale serve removes on exactly that; other servers may remove on any
// empty set), where setxattr(2) would leave it there, empty.
package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote/cache"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/remote/writeback"
	"github.com/shalefs/shale/stack"
)

// Options tune the client.
type Options struct {
	Key p9net.Key // the shared key of the server; nil: no authentication
	// Timeout bounds every request: one without a reply after it fails
	// with EIO, and its connection is closed and dialled again; a request
	// made while disconnected waits that long for a new connection. 0
	// means 30 seconds.
	Timeout time.Duration
	Msize   uint32 // largest message; 0 means 1 MiB (the server may lower it)
	Logger  *slog.Logger

	// CacheSize bounds the file data cached while a journal controller
	// answers (remote/cache): in memory, or with CacheDir the size of the
	// object store there. 0 means 256 MiB; negative, no cache at all.
	CacheSize int64
	// CacheDir keeps the cache on disk, so that it survives a restart
	// of the client (remote/cache/disk.go). One client owns a directory at a time.
	CacheDir string

	// WriteDelay is how long written data may stay in the client before
	// it is written back, with a server that follows Sprite's rules
	// (remote/writeback): 0 means 30 s, negative means write through.
	WriteDelay time.Duration
	// DirtyMax bounds the delayed data: past it the files dirty longest
	// are written back at once. 0 means 64 MiB.
	DirtyMax int64
	// LostDir keeps conflict copies of delayed writes that could not be
	// written back (lost.go); "" means the state directory's lost/
	// (/var/lib/shale/lost as root).
	LostDir string

	idleFids     int                                  // idle node fids kept per connection; 0 means defaultIdleFids (tests lower it)
	cacheEntries int                                  // QIDs whose metadata is cached; 0 means defaultCacheEntries
	flushWait    time.Duration                        // how often evicted QIDs are reported; 0 means 2 s
	newJournal   bool                                 // a journal of its own even with CacheDir (shale watch)
	onRecord     func(*journal.Record, []layer.Event) // told of each record applied (shale watch)
}

const (
	defaultTimeout = 30 * time.Second
	defaultMsize   = 1 << 20
	// DefaultCacheSize is the file data a client caches by default.
	DefaultCacheSize    = 256 << 20
	defaultCacheEntries = 1 << 16
)

// FS is a client of one remote tree.
type FS struct {
	st       *stack.Stack
	ss       *session.Session
	where    string // the server, for errors: "9p server at " + where
	timeout  time.Duration
	log      *slog.Logger
	clientID string // names this client's locks on the server
	closing  sync.Once

	tree sync.Mutex // every node's parent, name and children, and named
	// named is the nodes in the tree, by file: a file's names are those
	// of all its nodes (hard links, and a node the kernel forgot while
	// another of the file lives: it keeps the name, see forget).
	named map[layer.Token][]*node
	// pinned is the nodes delayed writes go back through (node.Pin).
	pinned map[*node]bool

	procMu   sync.Mutex
	procs    map[uint64]*procEntry // lock owners holding locks or asking for them
	procIDs  map[uint32]bool       // the proc_ids of procs
	nextProc uint32
	// posix holds the POSIX lock owners of each file, through any handle:
	// a close of any descriptor of the file releases them (fcntl(2)).
	posix map[posixLock]bool

	ctr        counters
	cc         *cache.Cache
	jr         *jreader    // nil: no cache, no journal
	disk       *cache.Disk // with Options.CacheDir
	controller atomic.Bool // a journal controller answered the first connection
	liveMu     sync.Mutex  // guards live
	live       map[uint64]liveTok

	wb *writeback.Files // Sprite's rules: delayed writes, opens' versions

	kept    keptLocks // locks kept under delegations (keptlocks.go)
	refresh refreshes // directories to ask attributes of again (refresh.go)

	noGetlock  atomic.Bool // the server answered Tgetlock with an error
	noRenameat atomic.Bool // the server lacks Trenameat
	noUnlinkat atomic.Bool // the server lacks Tunlinkat
}

// New dials r, attaches, and returns the root of the remote tree as the
// bottom of st. The root also has Close, which ends the client. Its
// errors name the server and say what to check.
func New(ctx context.Context, st *stack.Stack, r p9net.Remote, opts Options) (layer.Node, error) {
	return newFS(ctx, st, func(ctx context.Context) (net.Conn, error) {
		return p9net.Dial(ctx, r.Addr, opts.Key)
	}, r.Addr.String(), r.Aname, opts)
}

func newFS(ctx context.Context, st *stack.Stack, dial func(context.Context) (net.Conn, error), where, aname string, opts Options) (*node, error) {
	fs := &FS{st: st, where: where, timeout: opts.Timeout, log: opts.Logger,
		procs: map[uint64]*procEntry{}, procIDs: map[uint32]bool{}, posix: map[posixLock]bool{},
		named: map[layer.Token][]*node{}, pinned: map[*node]bool{}}
	if fs.timeout <= 0 {
		fs.timeout = defaultTimeout
	}
	if opts.Msize == 0 {
		opts.Msize = defaultMsize
	}
	if opts.idleFids <= 0 {
		opts.idleFids = defaultIdleFids
	}
	if fs.log == nil {
		fs.log = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	fs.clientID = fmt.Sprintf("shale:%s:%d:%d", host, os.Getpid(), time.Now().UnixNano())
	if err := fs.setupCache(where+"/"+aname, opts); err != nil {
		return nil, err
	}
	fs.ss = session.New(dial, session.ConnOptions{Msize: opts.Msize, Timeout: fs.timeout, Aname: aname,
		MaxIdle: opts.idleFids, Log: fs.log, Ctr: &fs.ctr.Counters})
	wcfg := writeback.Config{Session: fs.ss, Cache: fs.cc, Log: fs.log, Where: where,
		Delay: opts.WriteDelay, DirtyMax: opts.DirtyMax, LostDir: opts.LostDir, Notice: fs.notice, GenOf: fs.genOf}
	if fs.jr != nil {
		wcfg.Send = fs.jr.send
	}
	fs.wb = writeback.New(wcfg)
	if fs.jr != nil {
		// Before anything else on a new connection: the journal, so that
		// what the connection returns counts as cached, and with it the
		// reclaim of delayed writes (callbacks.go, remote/writeback).
		fs.ss.Then("opening the journal", fs.jr.open)
		fs.ss.OnLost(fs.jr.lost)
	}
	c, err := fs.ss.Start(ctx)
	if err != nil {
		fs.closeCache()
		return nil, fmt.Errorf("9p server at %s %w", where, err)
	}
	id := identOf(ctx)
	rfid, err := c.Root(whoOf(ctx))
	if err != nil {
		// Closed, so that the loss of c dials no more.
		fs.Close()
		hint := ""
		if aname != "" && !strings.HasPrefix(aname, "/") {
			// The URL's path loses its first slash to the URL.
			hint = fmt.Sprintf(" (a server such as diod names its trees by absolute path: 9p://HOST:PORT//%s, two slashes)", aname)
		}
		return nil, fmt.Errorf("9p server at %s refused to attach %q as uid %d (%v): check the tree's name (the URL's path, or ?aname= on a unix socket)%s and that the server exports it to this user", where, aname, id.uid, session.Errno(err), hint)
	}
	ra, err := c.Getattr(rfid)
	if err != nil {
		fs.Close()
		return nil, fmt.Errorf("9p server at %s attached %q but cannot stat its root (%v): check the exported directory on the server", where, aname, session.Errno(err))
	}
	root := fs.newNode(session.Token(&ra))
	root.isRoot = true
	return root, nil
}

// setupCache makes the cache, on disk with opts.CacheDir (taking the
// directory), and the journal reader that keeps it current.
func (fs *FS) setupCache(server string, opts Options) error {
	fs.live = map[uint64]liveTok{}
	size := opts.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	entries := opts.cacheEntries
	if entries <= 0 {
		entries = defaultCacheEntries
	}
	var blocks cache.BlockStore = cache.NewMemBlocks(max(size, 0))
	if opts.CacheDir != "" && size > 0 {
		d, err := cache.OpenDisk(opts.CacheDir, size, server, fs.log)
		if err != nil {
			return err
		}
		fs.disk, blocks = d, d
	}
	fs.cc = cache.New(entries, blocks)
	fs.cc.Live = fs.isLive
	if size < 0 {
		return nil
	}
	fs.jr = &jreader{fs: fs, uuid: newUUID(), flushWait: opts.flushWait, onRecord: opts.onRecord}
	if fs.jr.flushWait <= 0 {
		fs.jr.flushWait = 2 * time.Second
	}
	if fs.disk != nil && !opts.newJournal {
		if pos, ok := fs.disk.Restore(fs.cc); ok {
			fs.jr.uuid, fs.jr.epoch, fs.jr.seq = pos.UUID, pos.Epoch, pos.Seq
		}
	}
	return nil
}

// liveTok is the nodes given out for one QID path, not yet forgotten.
type liveTok struct {
	gen   uint64
	nodes []*node
}

// newNode makes the node of tok, counted as given out until Forget.
func (fs *FS) newNode(tok layer.Token) *node {
	n := &node{fs: fs, tok: tok, fids: map[uint32]*session.Fid{}}
	fs.liveMu.Lock()
	l := fs.live[tok.Ino]
	l.gen = tok.Gen
	l.nodes = append(l.nodes, n)
	fs.live[tok.Ino] = l
	fs.liveMu.Unlock()
	return n
}

// forgot counts n as given out no more; true if it was the last node of
// its file.
func (fs *FS) forgot(n *node) bool {
	fs.liveMu.Lock()
	l, ok := fs.live[n.tok.Ino]
	if !ok {
		fs.liveMu.Unlock()
		return false
	}
	l.nodes = slices.DeleteFunc(l.nodes, func(m *node) bool { return m == n })
	if len(l.nodes) == 0 {
		delete(fs.live, n.tok.Ino)
	} else {
		fs.live[n.tok.Ino] = l
	}
	fs.liveMu.Unlock()
	if len(l.nodes) == 0 {
		fs.cc.Gone(n.tok.Ino)
	}
	for _, m := range l.nodes {
		if m.tok == n.tok {
			return false
		}
	}
	return true
}

// othersLive tells whether a node of n's file other than n is given out.
func (fs *FS) othersLive(n *node) bool {
	fs.liveMu.Lock()
	defer fs.liveMu.Unlock()
	for _, m := range fs.live[n.tok.Ino].nodes {
		if m != n && m.tok == n.tok {
			return true
		}
	}
	return false
}

func (fs *FS) isLive(path uint64) bool {
	fs.liveMu.Lock()
	defer fs.liveMu.Unlock()
	_, ok := fs.live[path]
	return ok
}

// genOf is the generation of path's token, as a node given out or the
// cache has it; 0 if neither knows it (then no view holds it).
func (fs *FS) genOf(path uint64) uint64 {
	fs.liveMu.Lock()
	l, ok := fs.live[path]
	fs.liveMu.Unlock()
	if ok {
		return l.gen
	}
	return fs.cc.GenOf(path)
}

// Close ends the client: its connection, and every request after; a
// disk cache is saved, to be used by the next client of its directory.
func (fs *FS) Close() error {
	var err error
	fs.closing.Do(func() {
		// Delayed writes go to the server before the connection does,
		// within one timeout in all.
		ctx, cancel := context.WithTimeout(context.Background(), fs.timeout)
		fs.wb.WriteBackAll(ctx, writeback.Unmount)
		cancel()
		fs.wb.Leaving()
		fs.wb.Close()
		fs.ss.Close()
		err = fs.closeCache()
	})
	return err
}

func (fs *FS) closeCache() error {
	if fs.disk == nil {
		return nil
	}
	var pos *cache.JournalPos
	if j := fs.jr; j != nil {
		j.mu.Lock()
		pos = &cache.JournalPos{UUID: j.uuid, Epoch: j.epoch, Seq: j.seq}
		j.mu.Unlock()
	}
	return fs.disk.Save(pos, fs.cc)
}

// ident is who a request runs as: who, the number of its credentials
// (session.Who), is set by node.use only, as it costs a read of /proc.
type ident struct{ uid, gid, umask, who uint32 }

func identOf(ctx context.Context) ident {
	if c, ok := layer.CallerOf(ctx); ok {
		return ident{uid: c.Uid, gid: c.Gid, umask: c.Umask}
	}
	return ident{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
}

// whoOf numbers the credentials of ctx's caller (session.Who), which its
// fids are attached with: its uid, gid and supplementary groups (Supp if
// the frontend gave them, else its process's, from /proc: FUSE does not
// send them), or the uid alone if they cannot be read (its process has
// ended); without a caller, the process's own.
func whoOf(ctx context.Context) uint32 {
	c, ok := layer.CallerOf(ctx)
	if !ok {
		return ownWho()
	}
	gs, err := c.Groups()
	if err != nil {
		return session.Who(session.Cred{Uid: c.Uid, Plain: true})
	}
	return session.Who(session.Cred{Uid: c.Uid, Gid: c.Gid, Groups: gs})
}

// ownWho numbers the process's own credentials.
var ownWho = sync.OnceValue(func() uint32 {
	gs, err := os.Getgroups()
	if err != nil {
		return session.Who(session.Cred{Uid: uint32(os.Geteuid()), Plain: true})
	}
	groups := make([]uint32, len(gs))
	for i, g := range gs {
		groups[i] = uint32(g)
	}
	return session.Who(session.Cred{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), Groups: groups})
})

// procEntry is a lock owner's Tlock proc_id and what keeps it: the locks
// it holds (one per file with POSIX locks of it, one per handle with a
// flock of it) and the lock requests under way for it. The entry goes
// when nothing keeps it, so procs holds only owners with locks, and an
// owner keeps its proc_id while it holds any.
type procEntry struct {
	id   uint32
	refs int
}

// procRef returns the Tlock proc_id of a lock owner, and keeps it until
// procUnref: owners are 64-bit, proc_id 32, so they are numbered rather
// than truncated, which could make two owners one on the server.
func (fs *FS) procRef(owner uint64) uint32 {
	fs.procMu.Lock()
	defer fs.procMu.Unlock()
	p := fs.procs[owner]
	if p == nil {
		for {
			fs.nextProc++
			if fs.nextProc != 0 && !fs.procIDs[fs.nextProc] {
				break
			}
		}
		p = &procEntry{id: fs.nextProc}
		fs.procs[owner] = p
		fs.procIDs[p.id] = true
	}
	p.refs++
	return p.id
}

// procUnref lets go of what procRef kept.
func (fs *FS) procUnref(owner uint64) {
	fs.procMu.Lock()
	defer fs.procMu.Unlock()
	fs.unrefLocked(owner)
}

func (fs *FS) unrefLocked(owner uint64) {
	p := fs.procs[owner]
	if p == nil {
		return
	}
	if p.refs--; p.refs <= 0 {
		delete(fs.procs, owner)
		delete(fs.procIDs, p.id)
	}
}

// raise tells subscribers that tok changed, on behalf of ctx's view.
func (fs *FS) raise(ctx context.Context, kind layer.EventKind, tok layer.Token, name string) {
	fs.raiseRange(ctx, kind, tok, name, 0, 0)
}

func (fs *FS) raiseRange(ctx context.Context, kind layer.EventKind, tok layer.Token, name string, off, n int64) {
	if !fs.st.Events().Active() {
		return
	}
	fs.st.Events().RaiseIn(ctx, layer.Event{Kind: kind, Token: tok, Name: name, View: layer.ViewOf(ctx), Off: off, Len: n})
}

// OptionsFromQuery reads a 9p:// URL's client options: keyfile=PATH,
// timeout=DURATION, msize=BYTES, cachesize=BYTES (0 or off: no cache),
// cachedir=DIR, writedelay=DURATION (0 or off: write through),
// dirtymax=BYTES, lostdir=DIR (Options.LostDir).
func OptionsFromQuery(q url.Values) (Options, error) {
	var o Options
	for k, v := range q {
		val := v[len(v)-1]
		switch k {
		case "keyfile":
			key, err := p9net.LoadKey(val)
			if err != nil {
				return o, err
			}
			o.Key = key
		case "timeout":
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return o, fmt.Errorf("timeout=%s: want a positive duration such as 30s", val)
			}
			o.Timeout = d
		case "msize":
			n, err := strconv.ParseUint(val, 10, 32)
			if err != nil || n < 8192 {
				return o, fmt.Errorf("msize=%s: want a number of bytes, at least 8192", val)
			}
			o.Msize = uint32(n)
		case "cachesize":
			if val == "off" || val == "0" {
				o.CacheSize = -1
				continue
			}
			n, err := humanize.ParseBytes(val)
			if err != nil || n < cache.BlockSize || n > 1<<50 {
				return o, fmt.Errorf("cachesize=%s: want a size such as 256MiB (at least 128KiB), or off", val)
			}
			o.CacheSize = int64(n)
		case "cachedir":
			if val == "" {
				return o, errors.New("cachedir=: want a directory")
			}
			o.CacheDir = val
		case "writedelay":
			d, err := time.ParseDuration(val)
			if val == "off" || val == "0" {
				d, err = -1, nil
			}
			if err != nil || d == 0 {
				return o, fmt.Errorf("writedelay=%s: want a duration such as 30s, or 0 to write through", val)
			}
			o.WriteDelay = d
		case "lostdir":
			if !filepath.IsAbs(val) {
				return o, fmt.Errorf("lostdir=%s: want an absolute directory", val)
			}
			o.LostDir = val
		case "dirtymax":
			n, err := humanize.ParseBytes(val)
			if err != nil || n < 1<<20 || n > 1<<40 {
				return o, fmt.Errorf("dirtymax=%s: want a size such as 64MiB (at least 1MiB)", val)
			}
			o.DirtyMax = int64(n)
		default:
			return o, fmt.Errorf("unknown option %s: a 9p:// lower takes keyfile, timeout, msize, cachesize, cachedir, writedelay, dirtymax and lostdir", k)
		}
	}
	return o, nil
}

// A 9p://... lower is a remote tree.
func init() {
	stack.RegisterBackend(stack.Backend{Scheme: "9p", Open: func(st *stack.Stack, lower string) (layer.Node, error) {
		r, ok, err := p9net.ParseRemote(lower)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errors.New(lower + ": not a 9p:// URL")
		}
		opts, err := OptionsFromQuery(r.Query)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lower, err)
		}
		opts.Logger = st.Log()
		return New(context.Background(), st, r, opts)
	}})
}
