package remote

import (
	"context"
	"sync"
	"time"

	"github.com/shalefs/shale/layer"
)

// A directory whose names this client changed has its attributes, and
// its listing if one was cached, asked again in the background once its
// changes pause (issue 27): its mtime and ctime moved on the server,
// which 9P's replies do not carry (NFS has post-operation attributes for
// it), and a listing's entries have the server's offsets, which this
// client cannot make up for a name it added, so the cache dropped them;
// the next stat or listing of the directory (a build's next step) would
// wait for the server. An answer is cached only if nothing changed the
// directory after it was asked (the cache's snapshot); a stat or listing
// before it asks as before. The pause (refreshAfter) makes a burst of
// changes (cp -r, rm -r) cost one refresh, not one each. The listing is
// read as the user whose change dropped it (with the credentials of
// that change), and moves the directory's atime on the server as any
// listing does; it starts no lookups ahead.

const refreshAfter = 50 * time.Millisecond

// refreshes are the directories waiting for theirs.
type refreshes struct {
	mu    sync.Mutex
	dirs  map[layer.Token]*refresh
	after time.Duration // the pause: refreshAfter, or a test's
}

type refresh struct {
	t *time.Timer
	// list: a change dropped a listing cached for its user, uid (acting
	// as who): the listing is read again as that user.
	list     bool
	uid, who uint32
	// running: the refresh is under way; again: a change came meanwhile,
	// and it runs again after the pause. The entry goes once a run had
	// no change under it.
	running, again bool
}

// ownEntryChanged drops what the cache holds of name in directory n
// after this client changed it through ctx, and has n asked again.
func (n *node) ownEntryChanged(ctx context.Context, name string) {
	cc := n.fs.cc
	_, listed := cc.Listing(n.tok.Ino, identOf(ctx).uid)
	cc.DropEntry(n.tok.Ino, name)
	if !cc.On.Load() {
		return
	}
	r := &n.fs.refresh
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.after == 0 {
		r.after = refreshAfter
	}
	f := r.dirs[n.tok]
	switch {
	case f == nil:
		if r.dirs == nil {
			r.dirs = map[layer.Token]*refresh{}
		}
		f = &refresh{}
		f.t = time.AfterFunc(r.after, func() { n.refresh(f) })
		r.dirs[n.tok] = f
	case f.running:
		f.again = true
	default:
		f.t.Reset(r.after)
	}
	if listed {
		f.list, f.uid, f.who = true, identOf(ctx).uid, whoOf(ctx)
	}
}

// refresh asks n's attributes and listing again, those not cached now.
func (n *node) refresh(f *refresh) {
	r := &n.fs.refresh
	r.mu.Lock()
	f.running = true
	list, uid, who := f.list, f.uid, f.who
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		f.running = false
		if f.again && !n.fs.ss.Closed() {
			f.again = false
			f.t.Reset(r.after)
		} else {
			delete(r.dirs, n.tok)
		}
	}()
	fs := n.fs
	if fs.ss.Closed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), fs.timeout)
	defer cancel()
	if _, _, ok := fs.cc.Attr(n.tok.Ino); !ok {
		fs.ctr.dirsRefreshed.Add(1)
		var a layer.Attr
		n.fetchAttr(ctx, nil, &a, fs.cc.Snap())
	}
	if !list {
		return
	}
	if _, ok := fs.cc.Listing(n.tok.Ino, uid); ok {
		return
	}
	fs.ctr.listsRefreshed.Add(1)
	d, e := n.openDir(ctx, uid, who, true)
	if e != 0 {
		return
	}
	defer d.Close()
	for {
		if _, more, e := d.Next(ctx); !more || e != 0 {
			return
		}
	}
}
