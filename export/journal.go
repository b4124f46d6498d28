package export

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// The cache controller (seeds/004, package journal): a journal per client
// UUID, read through the synthetic tree of attach name journal.Aname
// (fid_journal.go), filled by the roots' holders from the stack's coherence
// manager with Change records about the QIDs the client may cache.

// Journal bounds' defaults (Options).
const (
	defaultJournalRecords  = 65536
	defaultJournalAge      = time.Hour
	defaultJournalInterest = 1000000
)

// controller holds a server's journals.
type controller struct {
	epoch                      uint64 // drawn at start: in every record
	maxRecords, maxInterest    int
	maxJournals                int
	maxBytes, maxMemory        int64 // jbounds.go
	maxAge                     time.Duration
	nameWait                   time.Duration // Options.NameWait, its default made (namewait.go)
	made, sent, resets, queued atomic.Int64  // records (stats)
	late                       atomic.Int64  // waits that gave up on a journal (stats)
	bytes, idleBytes           atomic.Int64  // all journals', and those without a connection (jbounds.go)

	mu       sync.Mutex
	journals map[string]*jrnl
	list     []*jrnl          // journals' values, made again (never changed) when nil
	swept    time.Time        // the last sweep by an event (jholder)
	views    map[uint32]*conn // connections' coherence views: whose change an event is
}

func newController(o *Options) *controller {
	var b [8]byte
	rand.Read(b[:])
	return &controller{
		epoch:       binary.LittleEndian.Uint64(b[:]),
		maxRecords:  o.JournalRecords,
		maxInterest: o.JournalInterest,
		maxJournals: o.MaxJournals,
		maxBytes:    o.JournalBytes,
		maxMemory:   o.JournalMemory,
		maxAge:      o.JournalAge,
		nameWait:    cmp.Or(o.NameWait, defaultNameWait),
		journals:    map[string]*jrnl{},
		views:       map[uint32]*conn{},
	}
}

// interestKey is a QID path as one root's stack knows it: roots may be
// layers whose events differ (shard folds its buckets'), and each root's
// holder speaks for its own.
type interestKey struct {
	r    *root
	path uint64
}

// jrnl is one client's journal.
type jrnl struct {
	ctl  *controller
	name string
	// owner is the principal of the peer that made it (p9net.Peer): only
	// connections of the same may open it, and reclaim through it.
	owner string

	mu sync.Mutex
	// recs are the records after base, oldest first; last is the newest
	// seq given. Reads at N forget those up to N.
	recs       []journal.Record
	base, last uint64
	interest   map[interestKey]uint8 // the QID's type
	bytes      int64                 // estimated: records and interest (jbounds.go)
	conns      int                   // connections that opened it
	gone       time.Time             // since when conns is 0
	wake       chan struct{}         // closed when a record is added
	applied    chan struct{}         // closed when base moves, or the last connection goes
	deleted    bool
	sprite     bool // the client follows Sprite's rules (its hello)
	follows    bool // and takes Follow (journal.Follows in its hello)
	delegates  bool // and takes delegations (journal.Delegates in its hello)
	// late is the seq a wait for this client gave up on (a name
	// change's, a write's): not waited for again until it applied that
	// (waitJournals, namewait.go).
	late uint64
}

// find returns the journal of name, after deleting those gone too long.
func (ctl *controller) find(name string) *jrnl {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	ctl.sweepLocked(time.Now())
	return ctl.journals[name]
}

// create makes the journal of name for owner: EEXIST if there is one.
func (ctl *controller) create(name, owner string) (*jrnl, syscall.Errno) {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	ctl.sweepLocked(time.Now())
	if ctl.journals[name] != nil {
		return nil, syscall.EEXIST
	}
	if e := ctl.roomLocked(); e != 0 {
		return nil, e
	}
	j := &jrnl{ctl: ctl, name: name, owner: owner, interest: map[interestKey]uint8{}, gone: time.Now(), wake: make(chan struct{}), applied: make(chan struct{})}
	ctl.journals[name] = j
	ctl.list = nil
	return j, 0
}

// sweepLocked deletes the journals whose clients have been away longer
// than maxAge: their next Tlcreate makes a new one, which tells them to
// drop everything. It is lazy (on access and on events): a journal past
// its age that nobody asks about costs only its memory, bounded anyway.
func (ctl *controller) sweepLocked(now time.Time) {
	for _, j := range ctl.journals {
		j.mu.Lock()
		old := j.conns == 0 && now.Sub(j.gone) > ctl.maxAge
		j.mu.Unlock()
		if old {
			ctl.deleteLocked(j)
		}
	}
}

// attach associates a connection with j; EBUSY for one that has another
// journal, ENOENT if j was deleted meanwhile, EACCES if another peer made
// it (a UUID is no secret worth a client's caching rights: it is in
// logs).
func (ctl *controller) attach(c *conn, j *jrnl) syscall.Errno {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	if ctl.journals[j.name] != j {
		return syscall.ENOENT
	}
	if j.owner != c.peer.Principal {
		return syscall.EACCES
	}
	if cur := c.journal.Load(); cur != nil {
		if cur != j {
			return syscall.EBUSY
		}
		return 0
	}
	c.journal.Store(j)
	j.mu.Lock()
	if j.conns++; j.conns == 1 {
		ctl.idleBytes.Add(-j.bytes)
	}
	j.mu.Unlock()
	return 0
}

// detach ends c's association with its journal, at the connection's end:
// the journal's age starts.
func (ctl *controller) detach(c *conn) {
	j := c.journal.Swap(nil)
	if j == nil {
		return
	}
	j.mu.Lock()
	if j.conns--; j.conns == 0 {
		j.gone = time.Now()
		if !j.deleted {
			j.ctl.idleBytes.Add(j.bytes)
		}
		j.appliedLocked() // nobody left to wait for
	}
	j.mu.Unlock()
}

// addView records that v is c's coherence view, and forgetView that it
// is no more.
func (ctl *controller) addView(v uint32, c *conn) {
	ctl.mu.Lock()
	ctl.views[v] = c
	ctl.mu.Unlock()
}

func (ctl *controller) forgetView(v uint32) {
	ctl.mu.Lock()
	delete(ctl.views, v)
	ctl.mu.Unlock()
}

// note adds a QID of root r that the request of ctx returns, or learns
// something of, to the interest set of the connection's journal, if it
// has one: before the request reads the file, so that a change after the
// read makes a record. Synthetic directories (no root) never change.
func (c *conn) note(ctx context.Context, r *root, q p9wire.Qid) {
	j := c.journal.Load()
	if j == nil || r == nil {
		return
	}
	k := interestKey{r, q.Path}
	j.note(k, q.Type)
	if j.ctl.over() {
		j.ctl.trim()
	}
	if rq, ok := ctx.Value(reqKey{}).(*req); ok {
		rq.seen = append(rq.seen, k)
		rq.typs = append(rq.typs, q.Type)
	}
}

func (j *jrnl) note(k interestKey, typ uint8) {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.interest[k]
	if !ok && (len(j.interest) >= j.ctl.maxInterest || !j.fitsLocked(interestCost)) {
		// Forgetting some would make us miss their changes: the client
		// starts afresh instead.
		j.resetLocked()
	}
	if !ok {
		j.growLocked(interestCost)
	}
	j.interest[k] = typ
}

// drop removes path, of every root, from the interest set: the client
// no longer caches it.
func (j *jrnl) drop(roots map[string]*root, path uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, r := range roots {
		k := interestKey{r, path}
		if _, ok := j.interest[k]; ok {
			delete(j.interest, k)
			j.growLocked(-interestCost)
		}
	}
}

// addLocked appends a record, or replaces the queue by one Reset if it
// is full, and wakes the readers.
func (j *jrnl) addLocked(rec journal.Record) {
	cost := recCost(&rec)
	if len(j.recs) >= j.ctl.maxRecords || !j.fitsLocked(cost) {
		j.resetLocked()
		return
	}
	j.last++
	rec.Epoch, rec.Seq = j.ctl.epoch, j.last
	j.recs = append(j.recs, rec)
	j.growLocked(cost)
	j.ctl.made.Add(1)
	j.ctl.queued.Add(1)
	j.wakeLocked()
}

// resetLocked replaces the queue by one Reset and clears the interest
// set: the client drops everything when it reads it. The Reset stands
// for every record before it, so a read at any seq before it gets it.
func (j *jrnl) resetLocked() {
	j.ctl.queued.Add(1 - int64(len(j.recs)))
	j.base = 0
	j.last++
	j.recs = append(j.recs[:0:0], journal.Record{Kind: journal.Reset, Epoch: j.ctl.epoch, Seq: j.last})
	// A new map: a cleared one keeps its size.
	j.interest = map[interestKey]uint8{}
	j.growLocked(recordCost - j.bytes)
	j.ctl.made.Add(1)
	j.ctl.resets.Add(1)
	j.wakeLocked()
}

func (j *jrnl) wakeLocked() {
	close(j.wake)
	j.wake = make(chan struct{})
}

// change appends a Change record for k if the client may cache it.
// fields is called only then (it may translate a name).
// The fields are made outside j.mu: translating a name may take a
// layer's locks.
func (j *jrnl) change(k interestKey, fields func() []journal.Field) {
	j.mu.Lock()
	typ, ok := j.interest[k]
	j.mu.Unlock()
	if !ok {
		return
	}
	fs := fields()
	j.mu.Lock()
	j.addLocked(journal.Record{Kind: journal.Change, Qid: p9wire.Qid{Type: typ, Path: k.path}, Fields: fs})
	j.mu.Unlock()
}

// read returns the records after seq n that fit in count bytes,
// waiting until there is one, or ctx, stop or drain ends (EINTR). The records
// up to n are forgotten. If some after n are gone (forgotten by a read
// after n, or n is not a seq of this journal: a client that read another
// one, before a restart), the reply is one Reset with a new seq, and the
// interest set is cleared. A count too
// small for the next record is EINVAL: a short reply would look like
// the end of the file.
func (j *jrnl) read(ctx context.Context, stop, drain <-chan struct{}, n uint64, count int) ([]byte, syscall.Errno) {
	for {
		j.mu.Lock()
		if n < j.base || n > j.last {
			j.resetLocked()
			b, e := j.replyLocked(count)
			j.mu.Unlock()
			return b, e
		}
		j.forgetLocked(n)
		if len(j.recs) > 0 {
			b, e := j.replyLocked(count)
			j.mu.Unlock()
			return b, e
		}
		wake := j.wake
		j.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, syscall.EINTR
		case <-stop:
			return nil, syscall.EINTR
		case <-drain:
			return nil, syscall.EINTR // the server is ending
		}
	}
}

// forgetLocked drops the records up to seq n.
func (j *jrnl) forgetLocked(n uint64) {
	if n <= j.base {
		return
	}
	k := 0
	var freed int64
	for k < len(j.recs) && j.recs[k].Seq <= n {
		freed += recCost(&j.recs[k])
		k++
	}
	j.recs = j.recs[k:]
	j.growLocked(-freed)
	j.ctl.queued.Add(-int64(k))
	j.base = n
	j.appliedLocked()
}

func (j *jrnl) appliedLocked() {
	close(j.applied)
	j.applied = make(chan struct{})
}

// replyLocked encodes the first records that fit in count.
func (j *jrnl) replyLocked(count int) ([]byte, syscall.Errno) {
	var b []byte
	k := 0
	for _, rec := range j.recs {
		start := len(b)
		b = journal.Append(b, &rec)
		if len(b) > count {
			b = b[:start]
			break
		}
		k++
	}
	if k == 0 {
		return nil, syscall.EINVAL
	}
	j.ctl.sent.Add(int64(k))
	return b, 0
}

// jholder is a root's holder in the coherence manager: it turns the
// events of the root's layer into records of the journals that hold
// their QID. It runs on the raiser's goroutine, which may hold layer
// locks: it only appends, under the journals' mutexes, and wakes readers.
type jholder struct {
	s *Server
	r *root
}

func (h jholder) Invalidate(ev layer.Event) {
	ctl := h.s.ctl
	ctl.mu.Lock()
	// Sweeping costs every journal's lock: once a second is enough for
	// an age of an hour (find and create sweep at once).
	if now := time.Now(); now.Sub(ctl.swept) >= time.Second {
		ctl.swept = now
		ctl.sweepLocked(now)
	}
	var own *jrnl
	if c := ctl.views[ev.View]; c != nil && ev.View != 0 {
		// The client made this change: it knows from the reply.
		own = c.journal.Load()
	}
	if ctl.list == nil {
		ctl.list = make([]*jrnl, 0, len(ctl.journals))
		for _, j := range ctl.journals {
			ctl.list = append(ctl.list, j)
		}
	}
	js := ctl.list
	ctl.mu.Unlock()
	if ev.Kind == layer.Everything {
		for _, j := range js {
			j.mu.Lock()
			j.resetLocked()
			j.mu.Unlock()
		}
		return
	}
	k := interestKey{h.r, ev.Token.Ino}
	var fields []journal.Field
	once := func() []journal.Field {
		if fields == nil {
			fields = h.fields(ev)
		}
		return fields
	}
	for _, j := range js {
		if j != own {
			j.change(k, once)
		}
	}
	if ctl.over() {
		ctl.trim()
	}
}

// fields says what ev changed, in the terms of h's root: a Data range
// only where the layer keeps the bottom's offsets, an entry's name as the
// layer shows it. An entry is always EntryChanged: telling added from
// removed would take a lookup here, under the raiser's locks, and could
// be wrong by the time the client reads it.
func (h jholder) fields(ev layer.Event) []journal.Field {
	switch ev.Kind {
	case layer.Attrs:
		return []journal.Field{{Type: journal.Attrs}}
	case layer.Data:
		f := journal.Field{Type: journal.Data}
		if k, ok := h.r.n.(layer.OffsetKeeper); ok && k.KeepsOffsets() && ev.Off >= 0 && ev.Len >= 0 {
			f.Off, f.Len = uint64(ev.Off), uint64(ev.Len)
		}
		return []journal.Field{f}
	}
	// Entries: the directory's times, size and links change with them.
	attrs := journal.Field{Type: journal.Attrs}
	if name, ok := h.upperName(ev.Token, ev.Name); ok {
		return []journal.Field{attrs, {Type: journal.Entry, Op: journal.EntryChanged, Name: name}}
	}
	return []journal.Field{attrs, {Type: journal.Whole}}
}

// upperName is the name an entry event's lower name has in h's root's
// layer. Layers that change names translate it with the directory's node
// (layer.NameTranslator), which some connection must hold; if none does,
// or the name is the layer's own, there is no name to give.
func (h jholder) upperName(dir layer.Token, lower string) (string, bool) {
	if _, ok := h.r.n.(layer.NameTranslator); !ok {
		return lower, lower != ""
	}
	n := h.s.heldNode(nodeKey{h.r, dir})
	if n == nil {
		return "", false
	}
	t, ok := n.(layer.NameTranslator)
	if !ok {
		return lower, lower != ""
	}
	return t.UpperName(context.Background(), lower)
}

// heldNode returns a node some connection holds under k, or nil.
func (s *Server) heldNode(k nodeKey) layer.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		rec := c.nodes[k]
		c.mu.Unlock()
		if rec != nil {
			return rec.n
		}
	}
	return nil
}

// others is every journal but but.
func (ctl *controller) others(but *jrnl) []*jrnl {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	js := make([]*jrnl, 0, len(ctl.journals))
	for _, j := range ctl.journals {
		if j != but {
			js = append(js, j)
		}
	}
	return js
}

// waitJournals waits until each of js has applied what was queued for
// it, within timeout in all. One that lets it time out is late: not
// waited for again until it has applied what it was late with, so a
// stalled client costs the others one wait, not one a change (a stalled
// follower of a write-shared file would otherwise hold up every write).
func waitJournals(ctx context.Context, js []*jrnl, timeout time.Duration) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for i, j := range js {
		if j.behind() {
			continue
		}
		if !j.waitApplied(ctx, deadline.C) {
			if ctx.Err() == nil {
				for _, j := range js[i:] {
					j.gaveUp()
				}
			}
			return
		}
	}
}

// behind tells whether a wait gave up on j and it has not yet applied
// what that wait waited for.
func (j *jrnl) behind() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.base < j.late
}

// gaveUp marks j late at its newest record, unless it applied it.
func (j *jrnl) gaveUp() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.base < j.last {
		if j.late < j.last {
			j.ctl.late.Add(1)
		}
		j.late = j.last
	}
}

// waitApplied waits until the client has applied every record queued
// now, or has no connection; false if ctx or timeout ended it first.
func (j *jrnl) waitApplied(ctx context.Context, timeout <-chan time.Time) bool {
	j.mu.Lock()
	target := j.last
	for j.base < target && j.conns > 0 && !j.deleted {
		applied := j.applied
		j.mu.Unlock()
		unslot(ctx)
		select {
		case <-applied:
		case <-timeout:
			return false
		case <-ctx.Done():
			return false
		}
		j.mu.Lock()
	}
	j.mu.Unlock()
	return true
}

// Journal side: whether the client follows the rules, and the records
// sent to it.

func (j *jrnl) isSprite() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sprite
}

func (j *jrnl) connected() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.conns > 0
}

// add appends rec and returns its seq.
func (j *jrnl) add(rec journal.Record) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.addLocked(rec)
	return j.last
}
