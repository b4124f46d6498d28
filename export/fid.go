package export

import (
	"context"
	"sync"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// fid is the state of one fid that every kind of fid has: who acts
// through it, when it was made, and its use and release. What it is (is)
// serves the requests on it.
type fid struct {
	c   *conn
	seq uint64 // the order fids are made in: conn.pair takes two by it
	who layer.Caller

	released bool // guarded by c.mu

	// mu orders requests on the fid (read), and the ones that change
	// what it is, and its release (write).
	mu sync.RWMutex
	// is is written with mu held for writing, and c.mu inside it:
	// interrupt reads it under c.mu alone, as it must not wait for the
	// requests in flight, which it ends.
	is kind
}

// A kind is what a fid is: a file of a root (fileFid), an extended
// attribute's value (xattrFid) or a place of the journal tree (journalFid).
// Its methods serve the requests on the fid while it is in use, and
// answer with the reply, or nil for one that says only success. The
// kinds at a file of a root embed place, which answers as a fid that is
// not open.
type kind interface {
	walk(ctx context.Context, names []string) (*fid, []p9wire.Qid, syscall.Errno)
	xattrwalk(ctx context.Context, name string) (*xattrFid, syscall.Errno)
	getattr(ctx context.Context, m *p9wire.Getattr) (p9wire.Message, syscall.Errno)
	statfs(ctx context.Context, m *p9wire.FidReq) (p9wire.Message, syscall.Errno)
	lopen(ctx context.Context, m *p9wire.Lopen) (p9wire.Message, syscall.Errno)
	lcreate(ctx context.Context, m *p9wire.Lcreate) (p9wire.Message, syscall.Errno)
	read(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno)
	write(ctx context.Context, m *p9wire.Write) (p9wire.Message, syscall.Errno)
	readdir(ctx context.Context, m *p9wire.Read) (p9wire.Message, syscall.Errno)
	fsync(ctx context.Context, m *p9wire.Fsync) (p9wire.Message, syscall.Errno)

	// interrupt ends the requests that wait on the fid for ever (journal
	// reads): before anything that waits for the fid to be free.
	interrupt()
	// clunk is the fid's last request, which has it to itself.
	clunk(ctx context.Context) syscall.Errno
	// free gives back what the fid holds; nothing uses it any more.
	free(ctx context.Context)
}

// A fileKind is a kind at a file of a root (fileFid, xattrFid): the
// requests that need such a file are served by one. A fid of the journal
// tree is answered EOPNOTSUPP whatever the request's body, so these are
// not in kind.
type fileKind interface {
	kind
	at() *place
	setattr(ctx context.Context, m *p9wire.Setattr) (p9wire.Message, syscall.Errno)
	xattrcreate(ctx context.Context, m *p9wire.Xattrcreate) (p9wire.Message, syscall.Errno)
	lock(ctx context.Context, m *p9wire.Lock) (p9wire.Message, syscall.Errno)
	getlock(ctx context.Context, m *p9wire.Getlock) (p9wire.Message, syscall.Errno)
}

// newFid is a fid for who, which the caller makes something (is) before
// it binds it.
func (c *conn) newFid(who layer.Caller) *fid {
	return &fid{c: c, seq: c.seq.Add(1), who: who}
}

// use starts an operation on f, exclusive if it changes f: false if f has
// been released. done ends it.
func (f *fid) use(excl bool) bool {
	if excl {
		f.mu.Lock()
	} else {
		f.mu.RLock()
	}
	f.c.mu.Lock()
	ok := !f.released
	f.c.mu.Unlock()
	if !ok {
		f.done(excl)
	}
	return ok
}

func (f *fid) done(excl bool) {
	if excl {
		f.mu.Unlock()
	} else {
		f.mu.RUnlock()
	}
}

// become makes f what k is; f is in use, exclusively.
func (f *fid) become(k kind) {
	f.c.mu.Lock()
	f.is = k
	f.c.mu.Unlock()
}

// interrupt ends the requests that wait on f, in use or not.
func (f *fid) interrupt() {
	f.c.mu.Lock()
	k := f.is
	f.c.mu.Unlock()
	k.interrupt()
}

// release gives back everything f holds, once the requests on it end.
func (f *fid) release() {
	f.c.mu.Lock()
	if f.released {
		f.c.mu.Unlock()
		return
	}
	f.released = true
	f.c.mu.Unlock()
	f.interrupt()
	f.mu.Lock()
	k := f.is
	f.mu.Unlock()
	// The connection may have ended: what is given back is not cancelled.
	k.free(f.opCtx(f.c.base))
}

// clunk serves f's last request; f is no more bound to its number.
func (f *fid) clunk(ctx context.Context) syscall.Errno {
	f.interrupt()
	defer f.release()
	if !f.use(true) {
		return syscall.EBADF
	}
	defer f.done(true)
	return f.is.clunk(f.opCtx(ctx))
}

// fileAt is the place of f's file of a root, nil in the journal tree; f
// is in use.
func (f *fid) fileAt() *place {
	if k, ok := f.is.(fileKind); ok {
		return k.at()
	}
	return nil
}

// opCtx is ctx carrying f's caller, through its root's view; f is in use.
func (f *fid) opCtx(ctx context.Context) context.Context {
	var r *root
	if p := f.fileAt(); p != nil {
		r = p.r
	}
	return f.c.callerCtx(ctx, f.who, r)
}

// enter is opCtx for a request on f, which the client may cache what it
// learns of: f's file is noted in the journal.
func (f *fid) enter(ctx context.Context) context.Context {
	if p := f.fileAt(); p != nil {
		f.c.note(ctx, p.r, p.qid())
	}
	return f.opCtx(ctx)
}
