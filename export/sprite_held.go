package export

import (
	"context"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Attributes of delayed data (issue 23; journal.Follow and Held): a
// Tgetattr of a file another client holds delayed writes of answers that
// client's size and mtime, as Sprite's server asked the client caching
// the dirty data (seeds/001; NFSv4's CB_GETATTR). The holder is asked
// (Follow) when another client follows the file as it opens it for
// writing, or at the first Tgetattr of another connection; from then on
// it tells them (Held) before each close that wrote returns, and the
// close returns once the followers' journals dropped what they had. So
// a stat on another client that starts after the close shows it.

// heldWait bounds a Tgetattr's wait for a holder's answer: a stat is
// not worth an open's wait (a client that answers no Follow in time is
// not waited for again until its next open for writing).
const heldWait = time.Second

// heldAttr is what a client holding delayed writes of a file said of it.
type heldAttr struct {
	vers  uint32 // its dirty mark when it said it: older marks say nothing
	has   bool   // it holds delayed writes: size and mtime are its
	size  uint64
	mtime time.Time
}

// followsHeld tells whether j's client takes Follow (its hello said so).
func (j *jrnl) followsHeld() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.follows
}

// followersOf is the journals but but that follow k.
func (s *Server) followersOf(k interestKey, but *jrnl) []*jrnl {
	js := s.ctl.others(but)
	out := js[:0]
	for _, j := range js {
		j.mu.Lock()
		_, ok := j.interest[k]
		j.mu.Unlock()
		if ok {
			out = append(out, j)
		}
	}
	return out
}

// followLocked sends h a Follow of k for its dirty mark v, once a mark.
func (st *fstate) followLocked(k interestKey, h *jrnl, v uint32) {
	if st.following == nil {
		st.following = map[*jrnl]uint32{}
		st.held = map[*jrnl]heldAttr{}
	}
	if w, ok := st.following[h]; ok && w == v {
		return
	}
	st.following[h] = v
	h.add(journal.Record{Kind: journal.Follow, Qid: p9wire.Qid{Type: p9wire.QTFile, Path: k.path}})
}

// openedForWriting is told that me may now delay writes of k (mark v):
// if another client follows k, me is asked to tell its attributes. Its
// open then returns after its journal applied the Follow.
func (sp *sprite) openedForWriting(k interestKey, me *jrnl, v uint32) {
	if !me.followsHeld() || len(sp.s.followersOf(k, me)) == 0 {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if st := sp.files[k]; st != nil && st.dirty[me] == v {
		st.followLocked(k, me, v)
	}
}

// heldFrom takes h's Held record: its attributes of the file, until its
// dirty mark changes. The other followers' journals get an Attrs record,
// and it returns once they applied it (or the recall timeout passed).
func (sp *sprite) heldFrom(ctx context.Context, h *jrnl, r *journal.Record) {
	size, mtime, has := journal.HeldOf(r)
	var keys []interestKey
	sp.mu.Lock()
	for _, k := range sp.s.rootKeys(r.Qid.Path) {
		st := sp.files[k]
		if st == nil || st.held == nil {
			continue
		}
		v, dirty := st.dirty[h]
		if !dirty {
			continue
		}
		st.held[h] = heldAttr{vers: v, has: has, size: size, mtime: mtime}
		st.wakeLocked()
		keys = append(keys, k)
	}
	sp.mu.Unlock()
	var js []*jrnl
	attrs := func() []journal.Field { return []journal.Field{{Type: journal.Attrs}} }
	for _, k := range keys {
		for _, j := range sp.s.followersOf(k, h) {
			j.change(k, attrs)
			js = append(js, j)
		}
	}
	waitJournals(ctx, js, sp.recallTimeout)
}

// overlayHeld puts into a, a Tgetattr's answer of k to c, the size and
// mtime of the clients other than c's that hold delayed writes of k,
// asking them first if they were not asked since they opened it for
// writing (up to heldWait).
func (sp *sprite) overlayHeld(ctx context.Context, k interestKey, c *conn, a *layer.Attr) syscall.Errno {
	me := c.journal.Load()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st := sp.files[k]
	if st == nil || len(st.dirty) == 0 {
		return 0
	}
	var deadline <-chan time.Time
	for {
		waiting := false
		for h, v := range st.dirty {
			if h == me || h == noJournal || !h.followsHeld() || st.isEvictedLocked(h) || !h.connected() {
				continue
			}
			st.followLocked(k, h, v)
			if ha, ok := st.held[h]; !ok || ha.vers != v {
				waiting = true
			}
		}
		if !waiting {
			break
		}
		if deadline == nil {
			t := time.NewTimer(min(sp.recallTimeout, heldWait))
			defer t.Stop()
			deadline = t.C
		}
		wake := st.wake
		sp.mu.Unlock()
		late := false
		select {
		case <-wake:
		case <-ctx.Done():
			sp.mu.Lock()
			return syscall.EINTR
		case <-deadline:
			late = true
		}
		sp.mu.Lock()
		for h, v := range st.dirty {
			if ha, ok := st.held[h]; late && h != me && st.held != nil && (!ok || ha.vers != v) {
				st.held[h] = heldAttr{vers: v} // not waited for again
			}
		}
	}
	for h, v := range st.dirty {
		if ha := st.held[h]; h != me && ha.has && ha.vers == v {
			a.Size = ha.size
			a.Blocks = max(a.Blocks, (ha.size+511)/512)
			if ha.mtime.After(a.Mtime) {
				a.Mtime = ha.mtime
			}
			if ha.mtime.After(a.Ctime) {
				a.Ctime = ha.mtime
			}
		}
	}
	return 0
}
