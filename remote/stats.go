package remote

import (
	"strconv"
	"sync/atomic"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/remote/writeback"
)

// Cache kinds, for hits and misses.
const (
	kindStat  = iota // Getattr and Lookup
	kindDir          // listings
	kindData         // file data
	kindLink         // readlink
	kindXattr        // getxattr and listxattr
	nKinds
)

var kindNames = [nKinds]string{"stat", "directory", "data", "readlink", "xattr"}

// counters are the client's statistics: atomics, bumped on every request.
type counters struct {
	session.Counters // requests by type, bytes
	hits, misses     [nKinds]atomic.Uint64
	records, resets  atomic.Uint64 // journal records applied; drop-everythings
	dropped          atomic.Uint64 // QIDs reported as Dropped
	bytesFromCache   atomic.Uint64
	bytesFromServer  atomic.Uint64
	journalRequests  atomic.Uint64 // Treads of the journal, counted apart from reqs

	readBytes, writeBytes  atomic.Uint64 // as programs read and wrote them
	staleOpens             atomic.Uint64 // opens of a node no name names now (revalidate.go)
	dirOpensUnsent         atomic.Uint64 // directory opens closed without reaching the server (OpenDir)
	lookupsAhead           atomic.Uint64 // lookups made ahead of the kernel's READDIRPLUS (ahead.go)
	locksKept, locksPushed atomic.Uint64 // lock calls served under a delegation; kept locks taken to the server (keptlocks.go)
	dirsRefreshed          atomic.Uint64 // directories' attributes asked again after own changes (refresh.go)
	listsRefreshed         atomic.Uint64 // and their listings
}

// SpriteStats are the counters of Sprite's tables (seeds/001) for a
// client of a server that follows its rules.
type SpriteStats struct {
	WriteDelay string `json:"write_delay"` // "off": write-through
	// Bytes as programs read and wrote them, and as they went to and
	// from the server (data reads; writes back and through).
	ReadBytes        uint64 `json:"read_bytes"`
	ReadServerBytes  uint64 `json:"read_server_bytes"`
	WriteBytes       uint64 `json:"write_bytes"`
	WriteServerBytes uint64 `json:"write_server_bytes"`
	// Written bytes that never reached the server: overwritten,
	// truncated or unlinked while delayed; and those lost (refused).
	Discarded  uint64            `json:"discarded_bytes"`
	Lost       uint64            `json:"lost_bytes"`
	DirtyBytes int64             `json:"dirty_bytes"`
	DirtyFiles int               `json:"dirty_files"`
	WriteBacks map[string]uint64 `json:"writebacks"` // by reason
	// Opens, and those that needed a consistency action.
	Opens           uint64 `json:"opens"`
	OpensStale      uint64 `json:"opens_stale"`   // another version: cache dropped
	OpensNoCache    uint64 `json:"opens_nocache"` // write-shared: not cached
	OpensRenamed    uint64 `json:"opens_renamed"` // of a file its name no longer names: ESTALE, looked up again
	Recalls         uint64 `json:"recalls"`       // Recall records answered
	Uncaches        uint64 `json:"uncaches"`      // Uncache records answered
	Cleans          uint64 `json:"cleans"`        // Cleans sent unasked: nothing dirty, no recall needed
	Helds           uint64 `json:"helds"`         // attributes of delayed data told the server for another client
	ReclaimsRefused uint64 `json:"reclaims_refused"`
	// Read delegations: granted, opens they answered without a
	// request, and those given back when the server asked.
	Delegations    uint64 `json:"delegations"`
	OpensDelegated uint64 `json:"opens_delegated"`
	Returns        uint64 `json:"delegations_returned"`
	// Lock calls (fcntl, flock) answered under a delegation without a
	// request, and kept locks later taken to the server.
	LocksKept   uint64 `json:"locks_kept"`
	LocksPushed uint64 `json:"locks_pushed"`
	// TimesKept are the owner's settings of times kept with delayed
	// writes: each saved a Tsetattr and a Tgetattr, and a write-back
	// before them.
	TimesKept uint64 `json:"times_kept"`
	// Size is the cache's size over time: a sample a minute, the last
	// hour (Sprite's Table 2 followed it over days).
	Size []writeback.SizeSample `json:"size"`
}

// Stats is a snapshot of a client's counters (shale stats MOUNTPOINT).
type Stats struct {
	Server   string            `json:"server"`
	Caching  bool              `json:"caching"` // a journal controller answers
	Journal  string            `json:"journal,omitempty"`
	Requests map[string]uint64 `json:"requests"` // by 9P type, journal reads apart
	Hits     map[string]uint64 `json:"hits"`
	Misses   map[string]uint64 `json:"misses"`
	Records  uint64            `json:"records"` // journal records applied
	Resets   uint64            `json:"resets"`  // times everything was dropped
	Dropped  uint64            `json:"dropped"` // QIDs told to the controller as dropped
	// JournalReads are the Treads of the journal (not in Requests).
	JournalReads  uint64 `json:"journal_reads"`
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
	CachedFiles   int    `json:"cached_files"`
	CachedBytes   int64  `json:"cached_bytes"` // file data held, in memory or on disk
	// DirOpensUnsent are directory opens that a cached listing let wait
	// for a Treaddir and that closed without one: each saved a walk, a
	// Tlopen and a clunk.
	DirOpensUnsent uint64 `json:"dir_opens_unsent"`
	// LookupsAhead are lookups made ahead of the kernel's READDIRPLUS,
	// several at once (ahead.go): each a walk, a Tgetattr and a clunk,
	// whose round trips overlap.
	LookupsAhead uint64 `json:"lookups_ahead"`
	// DirsRefreshed and ListsRefreshed are directories whose attributes,
	// and listings, were asked again in the background after this client
	// changed their names (refresh.go).
	DirsRefreshed  uint64 `json:"dirs_refreshed"`
	ListsRefreshed uint64 `json:"lists_refreshed"`
	// Pipelined are requests sent behind another without waiting for
	// its reply (a Twalk and the Tlopen of the fid it makes): each a
	// round trip saved.
	Pipelined uint64 `json:"pipelined"`
	// Sprite is there with a server that follows Sprite's rules.
	Sprite *SpriteStats `json:"sprite,omitempty"`
}

var typeNames = map[uint8]string{
	p9wire.Tstatfs: "statfs", p9wire.Tlopen: "lopen", p9wire.Tlcreate: "lcreate",
	p9wire.Tsymlink: "symlink", p9wire.Tmknod: "mknod", p9wire.Trename: "rename",
	p9wire.Treadlink: "readlink", p9wire.Tgetattr: "getattr", p9wire.Tsetattr: "setattr",
	p9wire.Txattrwalk: "xattrwalk", p9wire.Txattrcreate: "xattrcreate", p9wire.Treaddir: "readdir",
	p9wire.Tfsync: "fsync", p9wire.Tlock: "lock", p9wire.Tgetlock: "getlock", p9wire.Tlink: "link",
	p9wire.Tmkdir: "mkdir", p9wire.Trenameat: "renameat", p9wire.Tunlinkat: "unlinkat",
	p9wire.Tattach: "attach", p9wire.Twalk: "walk", p9wire.Tread: "read", p9wire.Twrite: "write",
	p9wire.Tclunk: "clunk", p9wire.Tremove: "remove", p9wire.Tversion: "version",
}

func (fs *FS) hit(kind int)  { fs.ctr.hits[kind].Add(1) }
func (fs *FS) miss(kind int) { fs.ctr.misses[kind].Add(1) }

// Stats returns the client's counters.
func (fs *FS) Stats() Stats {
	s := Stats{Server: fs.where, Requests: map[string]uint64{}, Hits: map[string]uint64{}, Misses: map[string]uint64{}}
	for t := range fs.ctr.Reqs {
		if v := fs.ctr.Reqs[t].Load(); v > 0 {
			name := typeNames[uint8(t)]
			if name == "" {
				name = "type" + strconv.Itoa(t)
			}
			s.Requests[name] = v
		}
	}
	for k := range nKinds {
		s.Hits[kindNames[k]] = fs.ctr.hits[k].Load()
		s.Misses[kindNames[k]] = fs.ctr.misses[k].Load()
	}
	s.Records, s.Resets, s.Dropped = fs.ctr.records.Load(), fs.ctr.resets.Load(), fs.ctr.dropped.Load()
	s.JournalReads = fs.ctr.journalRequests.Load()
	s.BytesSent, s.BytesReceived = fs.ctr.Sent.Load(), fs.ctr.Recv.Load()
	s.Caching = fs.cc.On.Load()
	s.Journal = fs.jr.id()
	s.CachedFiles, s.CachedBytes = fs.cc.Size()
	s.DirOpensUnsent = fs.ctr.dirOpensUnsent.Load()
	s.LookupsAhead = fs.ctr.lookupsAhead.Load()
	s.DirsRefreshed = fs.ctr.dirsRefreshed.Load()
	s.ListsRefreshed = fs.ctr.listsRefreshed.Load()
	s.Pipelined = fs.ctr.Piped.Load()
	if fs.wb.Sprite() {
		s.Sprite = fs.spriteStats()
	}
	return s
}

func (fs *FS) spriteStats() *SpriteStats {
	c, w := &fs.ctr, &fs.wb.Ctr
	s := &SpriteStats{WriteDelay: "off", ReadBytes: c.readBytes.Load(), ReadServerBytes: c.bytesFromServer.Load(),
		WriteBytes: c.writeBytes.Load(), WriteServerBytes: w.WriteServerBytes.Load(),
		Discarded: w.Discarded.Load(), Lost: w.Lost.Load(), DirtyBytes: fs.wb.DirtyBytes(),
		DirtyFiles: fs.wb.DirtyFiles(), WriteBacks: map[string]uint64{},
		Opens: w.Opens.Load(), OpensStale: w.OpensStale.Load(), OpensNoCache: w.OpensNoCache.Load(), OpensRenamed: fs.ctr.staleOpens.Load(),
		Recalls: w.Recalls.Load(), Uncaches: w.Uncaches.Load(), Cleans: w.Cleans.Load(), Helds: w.Helds.Load(), ReclaimsRefused: w.ReclaimsRefused.Load(),
		Delegations: w.Delegations.Load(), OpensDelegated: w.OpensDelegated.Load(), Returns: w.Returns.Load(),
		LocksKept: c.locksKept.Load(), LocksPushed: c.locksPushed.Load(),
		TimesKept: w.TimesKept.Load(),
		Size:      fs.wb.Sizes()}
	if fs.wb.Delay > 0 {
		s.WriteDelay = fs.wb.Delay.String()
	}
	for r := range writeback.NReasons {
		s.WriteBacks[writeback.ReasonNames[r]] = w.WriteBacks[r].Load()
	}
	return s
}

// StatsOf returns the statistics of the client whose tree root is the
// bottom of a stack, if root is one.
func StatsOf(root layer.Node) (Stats, bool) {
	n, ok := root.(*node)
	if !ok {
		return Stats{}, false
	}
	return n.fs.Stats(), true
}

// Caching tells whether the client whose root is root caches, a journal
// controller answering it: its views may then keep the kernel's caches
// long, as changes are pushed.
func Caching(root layer.Node) bool {
	n, ok := root.(*node)
	return ok && n.fs.controller.Load()
}
