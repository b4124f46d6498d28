package writeback

import (
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
)

// Uncached tells whether path's data must not be cached: the server
// found it write-shared.
func (w *Files) Uncached(tok layer.Token) bool {
	if !w.sprite.Load() {
		return false
	}
	sf := w.sfileOf(tok, false)
	return sf != nil && sf.uncached.Load()
}

// Uncaches is path's count of Uncache and Return records, taken before
// an open is sent (Opened's since): one that crossed the open's answer
// wins over it (the file stays uncached; a delegation the answer granted
// was taken back already).
func (w *Files) Uncaches(tok layer.Token) uint64 {
	sf := w.sfileOf(tok, false)
	if sf == nil {
		return 0
	}
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	return sf.uncaches
}

// OpenLock holds path's open lock until the returned function runs: from
// before its Tlopen until Opened has applied the answer. The server
// answers opens in order, and the answers (the version, whether the file
// is write-shared) must be applied in that order too: an older answer
// applied after a newer one turned caching back on for a file the server
// had just found write-shared, and the writes the client then delayed
// were recalled by nobody.
func (w *Files) OpenLock(path uint64) func() {
	if !w.sprite.Load() {
		return func() {}
	}
	return w.opens.lock(path)
}

// Opened applies an open's answer of the file tok: vers is the QID
// version of Rlopen or Rlcreate; h is its handle, which may write if
// write is true. A version other than the one cached (the one before it, for
// an open for writing, which bumped it) means another client changed the
// file: what is cached of it goes, here and in the kernels above.
// NoCache in vers turns caching of the file off; its absence turns it
// on, unless an Uncache came since the open was sent (since, from
// Uncaches): the server sent it after this answer.
func (w *Files) Opened(tok layer.Token, h Writer, vers uint32, write bool, since uint64) {
	if !w.sprite.Load() {
		return
	}
	w.Ctr.Opens.Add(1)
	path := tok.Ino
	sf := w.openState(tok)
	v := journal.VersionOf(vers)
	expect := sf.version
	if write {
		expect = journal.NextVersion(expect)
	}
	stale := sf.known && v != expect
	sf.version, sf.known = v, true
	if vers&journal.NoCache != 0 {
		sf.uncached.Store(true)
		w.Ctr.OpensNoCache.Add(1)
	} else if sf.uncaches == since {
		sf.uncached.Store(false)
	}
	switch {
	case vers&journal.Delegated == 0:
		if write {
			sf.deleg = false // the server took it back as it answered
		}
	case !sf.deleg && sf.uncaches == since:
		// Granted at an open for writing too, when no other client
		// has the file open: this client's later opens for reading
		// need no request.
		sf.deleg = true
		w.Ctr.Delegations.Add(1)
	}
	if h != nil {
		if sf.handles == nil {
			sf.handles = map[Writer]bool{}
		}
		sf.handles[h] = write
	}
	sf.vmu.Unlock()
	if stale || sf.uncached.Load() {
		if stale {
			w.Ctr.OpensStale.Add(1)
		}
		w.Cache.DropData(path, 0, 0)
		w.Cache.DropAttrs(path)
		w.Notice(layer.Event{Kind: layer.Data, Token: tok})
	}
}

// Released forgets a handle of tok.
func (w *Files) Released(tok layer.Token, h Writer) {
	sf := w.sfileOf(tok, false)
	if sf == nil {
		return
	}
	sf.vmu.Lock()
	was, had := sf.handles[h]
	delete(sf.handles, h)
	sf.vmu.Unlock()
	sf.mu.Lock()
	if had && sf.d != nil && !sf.held() && !sf.linked && sf.f.Removed() {
		w.discardLocked(sf, "the last handle of a file removed here closed")
	}
	if was {
		w.cleanLocked(sf)
	}
	w.forgetIdle(sf)
	sf.mu.Unlock()
}

// Reopened takes the version a handle's open on a new connection got:
// its own open, not a sign of another client's change.
func (w *Files) Reopened(tok layer.Token, vers uint32, since uint64) {
	if !w.sprite.Load() {
		return
	}
	sf := w.openState(tok)
	sf.version, sf.known = journal.VersionOf(vers), true
	if vers&journal.Delegated != 0 && !sf.deleg && sf.uncaches == since {
		sf.deleg = true
		w.Ctr.Delegations.Add(1)
	}
	if vers&journal.NoCache != 0 {
		sf.uncached.Store(true)
	} else if sf.uncaches == since {
		sf.uncached.Store(false)
	}
	sf.vmu.Unlock()
}

// TakeErr returns, once, the error of a failed write-back of path.
func (w *Files) TakeErr(tok layer.Token) layer.Errno {
	sf := w.sfileOf(tok, false)
	if sf == nil {
		return 0
	}
	return layer.Errno(sf.err.Swap(0))
}

// NameChange marks the files numbered paths as having a name of theirs
// changed by this client (a rename or unlink sent, its bookkeeping not
// done): a write-back that finds no name of one meanwhile leaves its data
// for later rather than take the file for removed by another client (the
// unlink's Unlinked then discards it). done ends it.
func (w *Files) NameChange(paths []uint64) (done func()) {
	w.nmu.Lock()
	for _, p := range paths {
		w.naming[p]++
	}
	w.nmu.Unlock()
	return func() {
		w.nmu.Lock()
		for _, p := range paths {
			if w.naming[p]--; w.naming[p] == 0 {
				delete(w.naming, p)
			}
		}
		w.nmu.Unlock()
	}
}

// nameChanging tells whether a name change of path is in flight.
func (w *Files) nameChanging(path uint64) bool {
	w.nmu.Lock()
	defer w.nmu.Unlock()
	return w.naming[path] > 0
}
