package export

import "time"

// Eviction (cf. CephFS evicting a client that fails to release its
// capabilities): a connected client that does not answer a recall of a
// file within the recall timeout (while writing it back, progress moves
// the deadline) loses its caching of that file for evictFor (the journal
// age). Its opens of it then answer NoCache (it reads and writes
// through, and holds nothing for others to wait for), it is asked
// nothing more of it, and a reclaim of it marks nothing others wait for.
// So a client that ignores recalls stalls others' opens of a file once,
// not again at each of its opens for writing. What it held back it may
// still write back, as any late write-back, unless another client opened
// the file for writing since: then its write-back opens, reclaims, and
// writes through the handles it had open (their spriteOpen is revoked)
// are refused (ESTALE), and its client keeps a conflict copy. Refusing
// them whenever it was late would lose a client's data to a reader's
// open during a network stall.

// writtenElsewhere tells whether a client other than c's opened k's file
// for writing since c's client did.
func (sp *sprite) writtenElsewhere(k interestKey, c *conn) bool {
	me := c.journal.Load()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st := sp.files[k]
	return st != nil && st.lastWriter != nil && st.lastWriter != me
}

// maxProgress bounds, in recall timeouts, how long a client writing the
// file back keeps others' opens waiting.
const maxProgress = 10

// progress is told of a write of k's file through c. A client asked to
// write the file back that writes it is answering, however slowly (much
// delayed data over a slow link): its recall's deadline moves to the
// recall timeout after this write, up to maxProgress timeouts after the
// ask, so that a slow answer is not taken for none and evicted.
func (sp *sprite) progress(k interestKey, c *conn) {
	h := c.journal.Load()
	if h == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st := sp.files[k]
	if st == nil {
		return
	}
	if a, ok := st.asked[h]; ok {
		if now := time.Now(); now.Sub(a.first) < maxProgress*sp.recallTimeout {
			a.at = now
			st.asked[h] = a
		}
	}
}

// evictLocked takes h's caching of st away.
func (sp *sprite) evictLocked(st *fstate, h *jrnl) {
	st.evicted[h] = time.Now().Add(sp.evictFor)
	sp.evictions.Add(1)
	for oc, o := range st.opens {
		if oc.journal.Load() == h {
			for _, so := range o.sos {
				so.revoked.Store(true)
			}
		}
	}
}

// isEvictedLocked tells whether h (nil: none) may cache none of st now.
func (st *fstate) isEvictedLocked(h *jrnl) bool {
	until, ok := st.evicted[h]
	if ok && !time.Now().Before(until) {
		delete(st.evicted, h)
		return false
	}
	return ok
}

// evictingLocked tells whether an eviction of st still holds (and forgets
// those past).
func (st *fstate) evictingLocked(now time.Time) bool {
	for h, until := range st.evicted {
		if !now.Before(until) {
			delete(st.evicted, h)
		}
	}
	return len(st.evicted) > 0
}
