package export

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Sprite's consistency rules (seeds/001, Welch; docs/sprite.md), on top of
// the journal controller: the server sees every open and close of a
// regular file, keeps a version per file, knows which clients may hold
// dirty data of it (the last writers), and before an open returns makes
// them write back (Recall) or, when the file is open on two clients and
// one writes, turns caching of it off on all of them (Uncache, and
// journal.NoCache in the opener's QID).
//
// Clients are told apart by their journal (one per client, outliving
// its connections); a connection without one (diod's tools, the kernel's
// v9fs, an older shale) caches nothing and writes through, but its opens
// still count: it is recalled for and shared with like any other.

// recheck is how often a waiting open looks at its holders again.
const recheck = 100 * time.Millisecond

// Defaults of Options' Sprite bounds.
const (
	defaultRecallTimeout = 10 * time.Second
	defaultLease         = 20 * time.Second
	maxIdleFiles         = 1 << 16
)

// sprite is a server's open, version and dirty-data state.
type sprite struct {
	s             *Server
	recallTimeout time.Duration
	lease         time.Duration
	graceEnd      time.Time

	mu    sync.Mutex
	files map[interestKey]*fstate

	evictFor time.Duration // how long a client that failed a recall caches none of the file (evict.go)

	opens, writeOpens, recalls, shared, timeouts, graceWaits, writeBacks, refused, forged, evictions atomic.Uint64
	delegated, returns                                                                               atomic.Uint64
	outstanding                                                                                      atomic.Int64 // delegations held now
}

// fstate is one file's state.
type fstate struct {
	version uint32
	opens   map[*conn]*opens
	// dirty are the clients that may hold data of the file not written
	// back: those that opened it for writing since their last Clean.
	// The value is the file's version at that open (or reclaim): a Clean
	// that answers an ask made before a later open leaves the mark.
	dirty map[*jrnl]uint32
	// asked are the clients sent a Recall or Uncache not answered yet.
	asked map[*jrnl]ask
	// lastWriter is the client of the last open for writing since the
	// server started (nil: none; noJournal: a client without a journal):
	// write-backs and reclaims of anyone else would undo its writes.
	lastWriter *jrnl
	isShared   bool
	told       map[*jrnl]bool // sent Uncache in this episode of sharing
	wake       chan struct{}  // closed when dirty or asked shrink
	// evicted are the clients that failed to answer a recall of the
	// file in time, and until when they may cache none of it (evict.go).
	evicted map[*jrnl]time.Time
	// following are the clients sent a Follow, and the dirty mark it was
	// for; held, what they answered (sprite_held.go).
	following map[*jrnl]uint32
	held      map[*jrnl]heldAttr
	// delegs are the clients holding a read delegation of the file;
	// returning, those sent a Return not answered yet (sprite_deleg.go).
	delegs    map[*jrnl]bool
	returning map[*jrnl]ask
}

// ask is a Recall or Uncache sent: a Clean with a seq at or after the
// record's answers it.
type ask struct {
	seq     uint64
	uncache bool
	at      time.Time // when asked, or when the client last wrote the file since (progress)
	first   time.Time // when asked
	dirty   uint32    // dirty[h] when asked
}

type opens struct {
	r, w  int
	locks int           // opens that took locks (sprite_deleg.go)
	sos   []*spriteOpen // the fids' opens, which an eviction revokes
}

// spriteOpen is what an open fid registered, for its release.
type spriteOpen struct {
	k     interestKey
	write bool
	// revoked: its client failed a recall of the file since the open,
	// and writes through it are refused (evict.go).
	revoked atomic.Bool
	locked  bool // a lock was taken through it (sp.mu; sprite_deleg.go)
}

func newSprite(s *Server, o *Options) *sprite {
	sp := &sprite{s: s, recallTimeout: o.RecallTimeout, lease: o.Lease, evictFor: o.JournalAge, files: map[interestKey]*fstate{}}
	if sp.recallTimeout <= 0 {
		sp.recallTimeout = defaultRecallTimeout
	}
	if sp.lease <= 0 {
		sp.lease = defaultLease
	}
	if o.Grace > 0 {
		sp.graceEnd = time.Now().Add(o.Grace)
	}
	return sp
}

// spriteVers is the QID version of journal files: journal.Sprite when
// the server follows Sprite's rules.
func (s *Server) spriteVers() uint32 {
	if s.opts.Sprite {
		return journal.Sprite
	}
	return 0
}

func randomVersion() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return journal.VersionOf(binary.LittleEndian.Uint32(b[:]))
}

// stateLocked is k's state, made at first sight with a random version:
// a version a client cached before a restart must not match by chance.
func (sp *sprite) stateLocked(k interestKey) *fstate {
	st := sp.files[k]
	if st == nil {
		if len(sp.files) >= maxIdleFiles {
			sp.trimLocked()
		}
		st = &fstate{version: randomVersion(), opens: map[*conn]*opens{}, dirty: map[*jrnl]uint32{},
			asked: map[*jrnl]ask{}, told: map[*jrnl]bool{}, evicted: map[*jrnl]time.Time{}, wake: make(chan struct{}),
			delegs: map[*jrnl]bool{}, returning: map[*jrnl]ask{}}
		sp.files[k] = st
	}
	return st
}

// trimLocked forgets idle files' states (no opens, no dirty data): their
// next open gets a new version, so clients drop what they cached of them.
func (sp *sprite) trimLocked() {
	n := len(sp.files) / 4
	for k, st := range sp.files {
		if n == 0 {
			return
		}
		if len(st.opens) == 0 && len(st.dirty) == 0 && len(st.asked) == 0 && len(st.delegs) == 0 && !st.evictingLocked(time.Now()) {
			delete(sp.files, k)
			n--
		}
	}
}

func (st *fstate) wakeLocked() {
	close(st.wake)
	st.wake = make(chan struct{})
}

// open registers an open of k by c and returns the QID version to answer
// with: the file's version, with journal.NoCache if it is write-shared.
// It waits first, within the grace after a restart and until the clients
// holding dirty data of the file wrote it back.
//
// c is nil for an open through a FUSE view of the server's stack
// (Opening): it is not registered, but recalls and shares as any other.
//
// Unless create, the open then returns once the opener's journal has
// applied the records queued for it: a write-back that another open
// recalled just before may have changed the file, and what the opener's
// caches (its kernel's too) hold of it must go first. A Tlcreate does not
// wait, even one that recalled: its client's kernel holds the directory's
// lock, which that client's journal, dropping an entry of it, would wait
// for (TestCreateDoesNotWaitForItsJournal); the version it answers with
// tells the client whether what it cached of the file is old.
func (sp *sprite) open(ctx context.Context, k interestKey, c *conn, so *spriteOpen, write, create bool) (uint32, syscall.Errno) {
	var me *jrnl
	if c != nil {
		me = c.journal.Load()
	}
	sp.opens.Add(1)
	if write {
		sp.writeOpens.Add(1)
	}
	recalled, graceWaited, following := false, false, false
	sp.mu.Lock()
	for {
		st := sp.stateLocked(k)
		var wait <-chan time.Time
		if now := time.Now(); now.Before(sp.graceEnd) && st.lastWriter == nil {
			// Clients that were writing before the restart may not have
			// reclaimed yet: nobody opens a file no one reclaimed until
			// they had the time (one reclaimed is recalled as usual).
			if !graceWaited {
				graceWaited = true
				sp.graceWaits.Add(1)
			}
			wait = time.After(sp.graceEnd.Sub(now)) // or a reclaim of the file
		} else {
			shares := sp.sharesLocked(st, c, write)
			if shares && !st.isShared {
				st.isShared = true
				sp.shared.Add(1)
			}
			// Everyone else who may hold dirty data writes it back, and
			// with the file shared, everyone else who has it open stops
			// caching it.
			for h := range st.dirty {
				if h != me {
					sp.askLocked(st, k, h, journal.Recall, shares)
					recalled = true
				}
			}
			if shares {
				for oc := range st.opens {
					if h := oc.journal.Load(); oc != c && h != nil && h != me && !st.told[h] {
						sp.askLocked(st, k, h, journal.Uncache, true)
					}
				}
			}
			// A writer waits for the read delegations it takes back; a
			// reader need not: it changes nothing, and the holders
			// giving theirs back open for reading, so two of them
			// waiting for each other's would both wait out the timeout.
			var deadline time.Time
			if write {
				sp.returnLocked(st, k, me, true)
				deadline = sp.returnDeadlineLocked(st, k, me)
			}
			for h, a := range st.asked {
				if h == me {
					continue
				}
				d, gone := sp.deadline(h, a)
				if gone || !time.Now().Before(d) {
					sp.giveUpLocked(st, k, h, gone)
					continue
				}
				if deadline.IsZero() || d.Before(deadline) {
					deadline = d
				}
			}
			if deadline.IsZero() {
				o := st.opens[c]
				if o == nil {
					o = &opens{}
					if c != nil {
						st.opens[c] = o
					}
				}
				if so != nil {
					o.sos = append(o.sos, so)
				}
				if write {
					o.w++
					st.version = journal.NextVersion(st.version)
					st.lastWriter = noJournal
					if me != nil {
						st.lastWriter = me
					}
					sp.s.rights.supersede(k.path, st.lastWriter.name)
				} else {
					o.r++
				}
				evicted := st.isEvictedLocked(me)
				if me != nil && o.w > 0 && me.isSprite() && !shares && !evicted {
					// It may delay writes through any of its handles
					// now: caching comes back with an open that finds
					// the file not shared, even one for reading.
					st.dirty[me] = st.version
					sp.s.rights.grant(me.name, me.owner, k.path)
					following = true
				}
				st.isShared = shares
				if !shares {
					clear(st.told) // the episode is over
				}

				v := st.version
				if shares || evicted {
					v |= journal.NoCache
				}
				if sp.grantLocked(st, c, me, shares, evicted) {
					v |= journal.Delegated
				}
				sp.mu.Unlock()
				if following {
					sp.openedForWriting(k, me, v&^journal.NoCache)
				}
				if recalled {
					sp.recalls.Add(1)
				}
				if me != nil && !create {
					// What the recalled write-backs changed reaches the
					// opener's journal as records: applied before the
					// open returns, so its cache shows none of the old.
					t := time.NewTimer(sp.recallTimeout)
					me.waitApplied(ctx, t.C)
					t.Stop()
				}
				return v, 0
			}
			// Looked at again now and then: a holder's connection may
			// go meanwhile, and its lease then bounds the wait.
			wait = time.After(min(time.Until(deadline), recheck))
		}
		wake := st.wake
		sp.mu.Unlock()
		unslot(ctx) // the holders' answers may be behind it
		select {
		case <-wake:
		case <-wait:
		case <-ctx.Done():
			return 0, syscall.EINTR
		}
		sp.mu.Lock()
	}
}

// sharesLocked tells whether an open of st by c (for writing if write)
// leaves the file write-shared: open on another connection too, and one
// of the two writing (c may write through an earlier open).
func (sp *sprite) sharesLocked(st *fstate, c *conn, write bool) bool {
	if o := st.opens[c]; o != nil && o.w > 0 {
		write = true
	}
	for oc, o := range st.opens {
		if oc != c && (write || o.w > 0) {
			return true
		}
	}
	return false
}

// askLocked sends h a Recall (or, with uncache, an Uncache) of k, unless
// one is outstanding: an Uncache is sent even after a Recall, as the
// client must also stop caching.
func (sp *sprite) askLocked(st *fstate, k interestKey, h *jrnl, kind journal.Kind, uncache bool) {
	if uncache {
		kind = journal.Uncache
	}
	if a, ok := st.asked[h]; ok && (a.uncache || !uncache) {
		return
	}
	if !h.isSprite() || st.isEvictedLocked(h) {
		// It never said it follows the rules, or lost its caching of
		// the file (so it holds no dirty data): nothing to wait for.
		return
	}
	seq := h.add(journal.Record{Kind: kind, Qid: p9wire.Qid{Type: p9wire.QTFile, Path: k.path}})
	now := time.Now()
	st.asked[h] = ask{seq: seq, uncache: uncache, at: now, first: now, dirty: st.dirty[h]}
	if uncache {
		st.told[h] = true
	}
}

// deadline is when sp stops waiting for h's answer to a: the recall
// timeout after it was sent, or for a client without a connection, the
// lease after it went. gone is true if h's journal was deleted (its
// client was away past --journal-age).
func (sp *sprite) deadline(h *jrnl, a ask) (d time.Time, gone bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.deleted {
		return time.Time{}, true
	}
	if h.conns == 0 {
		return h.gone.Add(sp.lease), false
	}
	return a.at.Add(sp.recallTimeout), false
}

// giveUpLocked stops waiting for h about k: its dirty data, if any, is
// lost to the others, as a crashed machine's unsynced writes are. Its
// right to reclaim stays (rights.go): it may still write back late, as
// long as no other client writes the file (which supersedes the right).
func (sp *sprite) giveUpLocked(st *fstate, k interestKey, h *jrnl, gone bool) {
	delete(st.asked, h)
	delete(st.dirty, h)
	st.wakeLocked()
	if gone {
		sp.revokeLocked(h, k.path) // its journal went: it never comes back
		return
	}
	sp.timeouts.Add(1)
	connected := h.connected()
	if connected {
		sp.evictLocked(st, h)
	}
	sp.s.log.Warn("9p client did not answer a recall in time: the file opens without the writes it delayed",
		"client", h.name, "qid", k.path, "connected", connected, "evicted", connected)
}

// clean takes a client's Clean of path (from its journal write): it holds
// no dirty data of it. seq is the Recall or Uncache it answers (0: none).
func (sp *sprite) clean(h *jrnl, path, seq uint64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, st := range sp.filesOf(path) {
		st.answeredLocked(h, seq)
	}
	sp.revokeLocked(h, path)
}

// cleanUnasked takes a Clean h sent of itself (no Recall asked for it):
// it holds no dirty data of path as of version vers, the version its own
// last open for writing got. A later open for writing by h made a newer
// mark, which stays.
func (sp *sprite) cleanUnasked(h *jrnl, path uint64, vers uint32) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, st := range sp.filesOf(path) {
		if v, dirty := st.dirty[h]; dirty && v == vers {
			if _, asked := st.asked[h]; !asked {
				delete(st.dirty, h)
			}
		}
	}
	sp.revokeLocked(h, path)
}

// answeredLocked takes h's Clean with seq: it answers the ask sent at or
// before seq, and clears h's dirty mark unless h opened the file for
// writing again since that ask (a Clean crossing that open on the wire
// says nothing of what it wrote after: the mark stays, and the next
// open asks again).
func (st *fstate) answeredLocked(h *jrnl, seq uint64) {
	a, ok := st.asked[h]
	if !ok || seq < a.seq {
		return // stale, or unasked
	}
	delete(st.asked, h)
	if v, dirty := st.dirty[h]; dirty && v == a.dirty {
		delete(st.dirty, h)
	}
	st.wakeLocked()
}

// cleanAll takes a Clean of every file, answering what was asked before
// seq (after a Reset, which may have stood for lost Recalls).
func (sp *sprite) cleanAll(h *jrnl, seq uint64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for k, st := range sp.files {
		st.answeredLocked(h, seq)
		sp.revokeLocked(h, k.path)
	}
}

// goodbye forgets h's dirty marks, asks and delegations: its client
// ended, with everything written back.
func (sp *sprite) goodbye(h *jrnl) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.forgetDelegationsLocked(h)
	for k, st := range sp.files {
		_, d := st.dirty[h]
		_, a := st.asked[h]
		if d || a {
			delete(st.dirty, h)
			delete(st.asked, h)
			st.wakeLocked()
		}
		if d {
			sp.s.rights.revoke(h.name, k.path)
		}
	}
}

// noJournal stands for the clients without a journal as a lastWriter.
var noJournal = &jrnl{name: "(no journal)"}

// writeBack checks an open that only writes back delayed data (the
// journal.WriteBack flag): ESTALE if another client opened the file for
// writing after c's client did, which the write-back would undo, or c's
// client lost its caching of the file (evict.go).
func (sp *sprite) writeBack(k interestKey, c *conn) syscall.Errno {
	sp.writeBacks.Add(1)
	me := c.journal.Load()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if st := sp.stateLocked(k); me == nil || st.lastWriter != nil && st.lastWriter != me {
		sp.refused.Add(1)
		return syscall.ESTALE
	}
	return 0
}

// filesOf is the states of path in every root.
func (sp *sprite) filesOf(path uint64) []*fstate {
	var sts []*fstate
	for _, k := range sp.s.rootKeys(path) {
		if st := sp.files[k]; st != nil {
			sts = append(sts, st)
		}
	}
	return sts
}

// close ends an open of c that so registered.
func (sp *sprite) close(so *spriteOpen, c *conn) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st := sp.files[so.k]
	if st == nil {
		return
	}
	if o := st.opens[c]; o != nil {
		if so.write {
			o.w--
		} else {
			o.r--
		}
		if i := slices.Index(o.sos, so); i >= 0 {
			o.sos = slices.Delete(o.sos, i, i+1)
		}
		if so.locked {
			o.locks--
		}
		if o.r <= 0 && o.w <= 0 {
			delete(st.opens, c)
			st.wakeLocked()
		}
	}
}

// rootKeys is path's key in every root: a client's Dirty and Clean name
// only a QID path.
func (s *Server) rootKeys(path uint64) []interestKey {
	ks := make([]interestKey, 0, len(s.roots))
	seen := map[*root]bool{}
	for _, r := range s.roots {
		if !seen[r] {
			seen[r] = true
			ks = append(ks, interestKey{r, path})
		}
	}
	return ks
}

// Opening is an open through a FUSE view of the server's stack: the
// clients' delayed writes of the file come back first, and with the open
// for writing, those that have it open stop caching it.
func (h jholder) Opening(ctx context.Context, tok layer.Token, write bool) {
	if h.s.opts.Sprite {
		h.s.sp.open(ctx, interestKey{h.r, tok.Ino}, nil, nil, write, false)
	}
}

// changed is told of a change of k's data through c (a Twrite, a
// truncation): while the file is write-shared, the other clients' caches
// (their kernels' pages above all) must not show the old bytes once the
// change returns, so it returns once their journals read its record, or
// the recall timeout passed. Not only the sharers': a client that closed
// the file keeps its attributes, and the writer's close, which delays
// nothing of a shared file, would otherwise return before that client's
// stat shows the write (issue 23).
func (sp *sprite) changed(ctx context.Context, k interestKey, c *conn) {
	sp.mu.Lock()
	st := sp.files[k]
	if st == nil || !st.isShared && len(st.delegs) == 0 {
		sp.mu.Unlock()
		return
	}
	shared := st.isShared
	var js []*jrnl
	// A delegation goes with the change's record, which its client
	// applies before the change returns.
	for h := range st.delegs {
		if h != c.journal.Load() { // its own change its client knows
			js = append(js, h)
			sp.undelegateLocked(st, h)
		}
	}
	sp.mu.Unlock()
	if shared {
		js = append(js, sp.s.followersOf(k, c.journal.Load())...)
	}
	waitJournals(ctx, js, sp.recallTimeout)
}
