package export

import (
	"syscall"
)

// Who may say what of a file's delayed writes. A Dirty record (a reclaim,
// on a new connection) claims that the client holds delayed writes of a
// file: the server then makes every other open of it wait for them. It is
// taken only from a client that holds the file open for writing, or held
// it before: on this server (it is the file's last writer), or on the
// server before a restart (rights.go). Anyone else's is refused (EPERM),
// and costs the file's opens nothing. Clean records and the goodbye speak
// only of the sender's own marks, and a journal opens only to the peer
// that made it (controller.attach).

// dirtyFrom takes a client's Dirty of path: a reclaim after a
// reconnection. It is refused with ESTALE if another client opened the
// file for writing since the server started (writing back would undo
// that), and with EPERM if h never held it. If h lost its caching of the
// file (evict.go), it is taken but marks nothing others wait for.
func (sp *sprite) dirtyFrom(h *jrnl, path uint64) syscall.Errno {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	ks := sp.s.rootKeys(path)
	held, evicted := false, false
	for _, k := range ks {
		st := sp.files[k]
		if st == nil {
			continue
		}
		if w := st.lastWriter; w != nil && w != h {
			sp.refused.Add(1)
			return syscall.ESTALE
		}
		held = held || st.lastWriter == h || writingLocked(st, h)
		evicted = evicted || st.isEvictedLocked(h)
	}
	if !held && !sp.s.rights.reclaimable(h.name, h.owner, path) {
		sp.refused.Add(1)
		sp.forged.Add(1)
		sp.s.log.Warn("9p: a reclaim refused: the client never held the file open for writing", "client", h.name, "peer", h.owner, "qid", path)
		return syscall.EPERM
	}
	if evicted {
		return 0 // it may write back, but no open waits for it (evict.go)
	}
	for _, k := range ks {
		st := sp.stateLocked(k)
		st.dirty[h], st.lastWriter = st.version, h
		st.wakeLocked()
	}
	sp.s.rights.grant(h.name, h.owner, path)
	return 0
}

// writingLocked tells whether a connection of h's client has st's file
// open for writing.
func writingLocked(st *fstate, h *jrnl) bool {
	for oc, o := range st.opens {
		if o.w > 0 && oc.journal.Load() == h {
			return true
		}
	}
	return false
}

// revokeLocked records that h holds no delayed writes of path, unless it
// still does in some root's state.
func (sp *sprite) revokeLocked(h *jrnl, path uint64) {
	for _, st := range sp.filesOf(path) {
		if _, d := st.dirty[h]; d {
			return
		}
	}
	sp.s.rights.revoke(h.name, path)
}
