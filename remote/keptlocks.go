package remote

import (
	"context"
	"sync"
	"syscall"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/lock"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// Locks kept under a delegation (issue 27; journal.KeepsLocks). While
// this client holds a delegation of a file and no lock of it on the
// server, its shared locks of it (F_RDLCK, LOCK_SH) and their unlocks
// are kept here, in a table of its own, with no request: the server
// takes every other client's delegation of the file back before it
// grants a write lock of it or answers a test for one (a read lock
// conflicts with no kept lock), and delegates no file another client
// has locked, so no conflicting lock can be taken meanwhile. The kept
// locks go to the server (pushed: a Tlock each, through the handle that
// took it) before this client answers a Return, before its own open for
// writing (which ends the delegation there), before an exclusive lock
// of the file, and when the delegation ends some other way. A file's
// locks are all kept or all on the server, never some of each. Kept
// locks go with the connection, as the server's do: the next lock call
// of a handle that held some fails with EIO.
//
// Lock order: a handle's mu, then keptLocks.mu; never a request under
// keptLocks.mu.
type keptLocks struct {
	mu    sync.Mutex
	t     lock.Table
	files map[layer.Token]*keptFile
	// writers counts the opens for writing under way, per file: the
	// server may end the delegation as it answers one.
	writers map[uint64]int
	// srv counts, per file, the lock owners of this client's handles
	// with locks on the server (handle.owners), and the lock calls on
	// their way there: while any, none is kept.
	srv map[layer.Token]int
}

type keptFile struct {
	c *session.Conn // the delegation's connection: the locks go with it
	// by is the handle each owner took its locks through: the one to
	// push them through, whose release drops flock locks.
	by      map[lockOwner]*handle
	pushing chan struct{} // closed when a push ended; nil until one starts
}

// keepableLocked tells whether a lock call of lk may be kept: a shared
// lock or an unlock, of a file this client holds a delegation of from a
// server that takes delegations back for locks, and opens for writing
// of none now. Under k.mu, so that a lock the delegation's end did not
// see is kept before it and pushed with the rest.
func (h *handle) keepableLocked(c *session.Conn, lk *layer.Lock) bool {
	return lk.Type != syscall.F_WRLCK && c.Caps()&journal.KeepsLocks != 0 &&
		h.fs.kept.writers[h.n.tok.Ino] == 0 && h.fs.wb.Delegated(h.n.tok)
}

// setKept serves Setlk here if the file's locks are kept or may be; done
// false sends it to the server, after any push of kept locks it needed,
// and the caller then calls serverDone.
func (h *handle) setKept(ctx context.Context, owner uint64, lk *layer.Lock) (e layer.Errno, done bool) {
	k, tok := &h.fs.kept, h.n.tok
	c, e := h.fs.ss.Conn(ctx)
	if e != 0 {
		return e, true
	}
	if h.lostLocks() {
		return syscall.EIO, true
	}
	for {
		k.mu.Lock()
		f := k.files[tok]
		keep := h.keepableLocked(c, lk)
		switch {
		case f != nil && f.pushing != nil:
			k.mu.Unlock()
			if !waitPush(ctx, f) {
				return syscall.EINTR, true
			}
			continue
		case f != nil && f.c != c:
			k.mu.Unlock()
			k.lose(tok)
			if h.lostLocks() {
				return syscall.EIO, true
			}
			continue
		case f != nil && !keep:
			k.mu.Unlock()
			k.push(ctx, tok)
			continue // on the server now
		case f == nil && (!keep || k.srv[tok] > 0):
			k.srvAddLocked(tok, 1) // none kept until it is answered
			k.mu.Unlock()
			return 0, false
		case f == nil && lk.Type == syscall.F_UNLCK:
			k.mu.Unlock()
			return 0, true // nothing kept, nothing on the server
		}
		if f == nil {
			f = &keptFile{c: c, by: map[lockOwner]*handle{}}
			if k.files == nil {
				k.files = map[layer.Token]*keptFile{}
			}
			k.files[tok] = f
		}
		o := lockOwner{owner, lk.Flock}
		// Shared locks conflict with none: no wait.
		if e := k.t.Set(ctx, tok, owner, lk, false); e != 0 {
			k.mu.Unlock()
			return e, true
		}
		if lk.Type != syscall.F_UNLCK {
			f.by[o] = h
		} else if !k.t.Has(tok, owner, lk.Flock) {
			delete(f.by, o)
		}
		if len(f.by) == 0 {
			delete(k.files, tok)
		}
		k.mu.Unlock()
		h.fs.ctr.locksKept.Add(1)
		return 0, true
	}
}

// getKept serves Getlk here where this client knows the answer: a
// conflict among its kept locks, or none for a shared lock (no one else
// may hold an exclusive one while it holds a delegation). Others may
// keep shared locks under delegations of their own: an exclusive lock
// with no conflict here is asked of the server, which takes theirs back.
func (h *handle) getKept(ctx context.Context, owner uint64, lk *layer.Lock) (layer.Errno, bool) {
	k, tok := &h.fs.kept, h.n.tok
	c, e := h.fs.ss.Conn(ctx)
	if e != 0 {
		return e, true
	}
	shared := *lk
	shared.Type = syscall.F_RDLCK
	k.mu.Lock()
	f := k.files[tok]
	if !h.keepableLocked(c, &shared) || k.srv[tok] > 0 || f != nil && (f.pushing != nil || f.c != c) {
		k.mu.Unlock()
		return 0, false
	}
	got := *lk
	k.t.Get(tok, owner, &got)
	k.mu.Unlock()
	if got.Type == syscall.F_UNLCK && lk.Type == syscall.F_WRLCK {
		return 0, false
	}
	*lk = got
	h.fs.ctr.locksKept.Add(1)
	return 0, true
}

// flushKept drops owner's kept POSIX locks of the file: a close by it.
func (h *handle) flushKept(owner uint64) {
	h.fs.kept.drop(h.n.tok, func(o lockOwner, _ *handle) bool { return o == lockOwner{owner, false} })
}

// releaseKept drops the kept locks taken through h: its open file goes
// (a POSIX owner flushed them at its close already).
func (h *handle) releaseKept() {
	h.fs.kept.drop(h.n.tok, func(_ lockOwner, by *handle) bool { return by == h })
}

// drop releases the kept locks of tok of the owners which says, after
// any push under way (which puts them on the server: the caller's
// server path drops them there).
func (k *keptLocks) drop(tok layer.Token, which func(lockOwner, *handle) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f := k.files[tok]
	if f == nil {
		return
	}
	if f.pushing != nil {
		ch := f.pushing
		k.mu.Unlock()
		<-ch
		k.mu.Lock()
		return
	}
	for o, by := range f.by {
		if which(o, by) {
			k.t.Release(tok, o.owner, o.flock)
			delete(f.by, o)
		}
	}
	if len(f.by) == 0 {
		delete(k.files, tok)
	}
}

func waitPush(ctx context.Context, f *keptFile) bool {
	select {
	case <-f.pushing:
		return true
	case <-ctx.Done():
		return false
	}
}

// push takes tok's kept locks to the server, each through the handle
// that took it (opened there first if the delegation answered its
// open); a lock the server refuses is lost, which its handle's next lock
// call says (EIO). It returns once they are there.
func (k *keptLocks) push(ctx context.Context, tok layer.Token) {
	k.mu.Lock()
	f := k.files[tok]
	if f == nil {
		k.mu.Unlock()
		return
	}
	if f.pushing != nil {
		k.mu.Unlock()
		waitPush(ctx, f)
		return
	}
	if !f.c.Alive() {
		// Kept on a connection gone since: lost with it, not moved to
		// the new one (the server may have given the delegation up
		// meanwhile, and another client locked the file).
		k.mu.Unlock()
		k.lose(tok)
		return
	}
	f.pushing = make(chan struct{})
	hs := k.t.Take(tok)
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.files, tok)
		close(f.pushing)
		k.mu.Unlock()
	}()
	for _, l := range hs {
		h := f.by[lockOwner{l.Owner, l.Flock}]
		if h == nil {
			continue
		}
		if !h.pushLock(context.WithoutCancel(ctx), l.Owner, &l.Lock) {
			h.mu.Lock()
			h.locksLost = true
			h.mu.Unlock()
		}
		h.fs.ctr.locksPushed.Add(1)
	}
}

// pushLock takes owner's lock lk on the server through h.
func (h *handle) pushLock(ctx context.Context, owner uint64, lk *layer.Lock) bool {
	c, fid, _, e := h.use(ctx)
	if e != 0 {
		return false
	}
	typ, start, length := wireLock(lk)
	proc := h.fs.procRef(owner)
	defer h.fs.procUnref(owner)
	st, err := c.Lock(fid, typ, start, length, proc, h.fs.clientID)
	if err != nil || st != p9wire.LockSuccess {
		return false
	}
	h.took(owner, lk.Flock, typ, start, length)
	return true
}

// opening is told of an open for writing of path about to be sent: the
// server may end this client's delegation as it answers, so the kept
// locks go there first, and none is kept until the answer is taken
// (the returned func, called then).
func (k *keptLocks) opening(ctx context.Context, path uint64) func() {
	k.mu.Lock()
	if k.writers == nil {
		k.writers = map[uint64]int{}
	}
	k.writers[path]++
	k.mu.Unlock()
	k.pushPath(ctx, path)
	return func() {
		k.mu.Lock()
		if k.writers[path]--; k.writers[path] <= 0 {
			delete(k.writers, path)
		}
		k.mu.Unlock()
	}
}

// pathKept is the files of path (0: every file) with kept locks.
func (k *keptLocks) pathKept(path uint64) []layer.Token {
	k.mu.Lock()
	defer k.mu.Unlock()
	var toks []layer.Token
	for tok := range k.files {
		if path == 0 || tok.Ino == path {
			toks = append(toks, tok)
		}
	}
	return toks
}

// pushPath pushes the kept locks of path's files (0: of every file).
func (k *keptLocks) pushPath(ctx context.Context, path uint64) {
	for _, tok := range k.pathKept(path) {
		k.push(context.WithoutCancel(ctx), tok)
	}
}

// undelegate drops this client's delegations of path (0: of every
// file), which ended without a Return, and pushes their kept locks.
// On the journal's reader: the push, which takes requests, goes apart.
func (fs *FS) undelegate(path uint64) {
	fs.wb.Undelegate(path)
	if len(fs.kept.pathKept(path)) > 0 {
		go fs.kept.pushPath(context.Background(), path)
	}
}

// lose drops tok's kept locks, gone with their connection: the handles
// that took them say so at their next lock call.
func (k *keptLocks) lose(tok layer.Token) {
	k.mu.Lock()
	f := k.files[tok]
	if f == nil || f.pushing != nil {
		k.mu.Unlock()
		return
	}
	delete(k.files, tok)
	k.t.Take(tok)
	k.mu.Unlock()
	for _, h := range f.by {
		h.mu.Lock()
		h.locksLost = true
		h.mu.Unlock()
	}
}

// serverDone: a lock call setKept sent to the server was answered.
func (h *handle) serverDone() { h.fs.kept.ownersChanged(h.n.tok, -1) }

// ownersChanged adds n to the count of tok's lock owners on the server.
func (k *keptLocks) ownersChanged(tok layer.Token, n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.srvAddLocked(tok, n)
}

func (k *keptLocks) srvAddLocked(tok layer.Token, n int) {
	if k.srv == nil {
		k.srv = map[layer.Token]int{}
	}
	if k.srv[tok] += n; k.srv[tok] <= 0 {
		delete(k.srv, tok)
	}
}
