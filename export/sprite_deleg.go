package export

import (
	"context"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Read delegations (issue 27; journal.Delegated): with Options.Delegate,
// an open for reading of a file no one has open for writing, by a client
// that takes them, grants that client the file's later opens for reading
// without a Tlopen: the server has then counted it as opening the file
// for reading until it says otherwise. So before anything may change
// the file's data or names, the server takes the delegation back
// (Return) and waits for the answer (Returned): the client has by then
// opened on the server what it had open of the file, which Sprite's
// rules then see as any open (a writer shares the file with it). What
// changes the file: an open for writing, a truncation through a fid not
// open for writing, an unlink or rename of one of its names (close-to-
// open for names: the client's next open of the old name must fail).
// Changes made beside the server, in its directory directly, reach a
// delegated client with its journal, not at its next open.

// grantLocked grants me a read delegation of st at an open through c,
// if it takes them and no one else may change the file meanwhile, and
// tells whether it holds one: its answer says so (journal.Delegated).
// Its own opens for writing (through c) do not stand in the way: a
// client that writes a file no one else has open reads it back without
// a request (a build's output; the writer's data is its own), and
// anyone else's open still takes the delegation back or shares.
func (sp *sprite) grantLocked(st *fstate, c *conn, me *jrnl, shares, evicted bool) bool {
	if !sp.s.opts.Delegate || me == nil || shares || evicted || !me.takesDelegations() {
		return false
	}
	if len(st.returning) > 0 {
		return false // a writer or a name change is taking them back
	}
	if st.delegs[me] {
		return true
	}
	for oc, o := range st.opens {
		if oc != c && (o.w > 0 || o.locks > 0) {
			return false // another writer, or locks the grantee would not see
		}
	}
	for h := range st.dirty {
		if h != me {
			return false
		}
	}
	st.delegs[me] = true
	sp.outstanding.Add(1)
	sp.delegated.Add(1)
	return true
}

// returnLocked asks every client but me that holds a delegation of k to
// give it back, unless asked already. me's own stays, as its client
// knows its own change, unless mineGoes (an open for writing, at which
// its client drops it).
func (sp *sprite) returnLocked(st *fstate, k interestKey, me *jrnl, mineGoes bool) {
	for h := range st.delegs {
		if h == me {
			if mineGoes {
				sp.undelegateLocked(st, h)
			}
			continue
		}
		if _, asked := st.returning[h]; asked {
			continue
		}
		seq := h.add(journal.Record{Kind: journal.Return, Qid: p9wire.Qid{Type: p9wire.QTFile, Path: k.path}})
		now := time.Now()
		st.returning[h] = ask{seq: seq, at: now, first: now}
		sp.returns.Add(1)
	}
}

// returnDeadlineLocked is when the Returns of k sent to others than me
// are given up on (zero if none is outstanding); those past it are
// given up on now.
func (sp *sprite) returnDeadlineLocked(st *fstate, k interestKey, me *jrnl) time.Time {
	var deadline time.Time
	for h, a := range st.returning {
		if h == me {
			continue
		}
		d, gone := sp.deadline(h, a)
		if gone || !time.Now().Before(d) {
			sp.undelegateLocked(st, h)
			sp.timeouts.Add(1)
			sp.s.log.Warn("9p client did not give back a read delegation in time: the file changes under its cache",
				"client", h.name, "qid", k.path, "connected", !gone && h.connected())
			continue
		}
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	return deadline
}

// returned takes h's answer to the Returns of path up to seq.
func (sp *sprite) returned(h *jrnl, path, seq uint64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, st := range sp.filesOf(path) {
		if a, ok := st.returning[h]; ok && seq >= a.seq {
			sp.undelegateLocked(st, h)
		}
	}
}

// reclaimDelegations takes back the delegations others than c's client
// hold of k, and waits for them (or their deadline): before a change of
// its data or names that does not open it for writing.
func (sp *sprite) reclaimDelegations(ctx context.Context, k interestKey, c *conn) {
	if !sp.s.opts.Delegate {
		return
	}
	var me *jrnl
	if c != nil {
		me = c.journal.Load()
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for {
		st := sp.files[k]
		if st == nil {
			return
		}
		sp.returnLocked(st, k, me, false)
		deadline := sp.returnDeadlineLocked(st, k, me)
		if deadline.IsZero() {
			return
		}
		wake := st.wake
		sp.mu.Unlock()
		t := time.NewTimer(min(time.Until(deadline), recheck))
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		sp.mu.Lock()
		if ctx.Err() != nil {
			return
		}
	}
}

// locking is told of a Tlock that takes a lock (takes), or a Tgetlock,
// of type typ through so by c (journal.KeepsLocks). A write lock, or a
// test for one, takes back other clients' delegations of the file first,
// with the locks they kept, so that its conflicts are all here. A read
// lock need not: kept locks are shared, and conflict with none (and the
// Tlocks of a client pushing its kept locks, read locks, so never wait
// for another client's push).
func (sp *sprite) locking(ctx context.Context, so *spriteOpen, c *conn, typ uint8, takes bool) {
	if !sp.s.opts.Delegate || so == nil {
		return
	}
	if takes {
		sp.mu.Lock()
		if o := sp.files[so.k].openOf(c); o != nil && !so.locked {
			so.locked = true
			o.locks++
		}
		sp.mu.Unlock()
	}
	if typ == p9wire.LockWrite {
		sp.reclaimDelegations(ctx, so.k, c)
	}
}

// openOf is c's opens of st, or nil.
func (st *fstate) openOf(c *conn) *opens {
	if st == nil {
		return nil
	}
	return st.opens[c]
}

// reclaimNamed is reclaimDelegations of the file name is in dir, if any.
func (sp *sprite) reclaimNamed(ctx context.Context, r *root, dir layer.Node, name string, c *conn) {
	if !sp.s.opts.Delegate || sp.outstanding.Load() == 0 {
		return
	}
	var a layer.Attr
	n, e := dir.Lookup(ctx, name, &a)
	if e != 0 {
		return
	}
	tok := n.Token()
	n.Forget()
	sp.reclaimDelegations(ctx, interestKey{r, tok.Ino}, c)
}

// forgetDelegationsLocked drops h's delegations and Returns: its client
// ended, or its journal went.
func (sp *sprite) forgetDelegationsLocked(h *jrnl) {
	for _, st := range sp.files {
		sp.undelegateLocked(st, h)
	}
}

// undelegateLocked drops h's delegation of st and the Return of it, if
// any, and wakes the opens that wait for it.
func (sp *sprite) undelegateLocked(st *fstate, h *jrnl) {
	if st.delegs[h] {
		delete(st.delegs, h)
		sp.outstanding.Add(-1)
	}
	if _, ok := st.returning[h]; ok {
		delete(st.returning, h)
		st.wakeLocked()
	}
}

// takesDelegations tells whether j's client takes delegations (its hello
// said so).
func (j *jrnl) takesDelegations() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.delegates
}
