package remote

import (
	"context"
	"fmt"
	"path"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/cache"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/stack"
)

// Change is one change Watch reports.
type Change struct {
	Event string `json:"event"` // create, delete, rename, change (an entry), modify (data), attrib, reset
	Path  string `json:"path"`
	Old   string `json:"old,omitempty"` // rename: the name Path had before
	Off   uint64 `json:"off,omitempty"` // modify: the bytes changed; Len 0 is to the end
	Len   uint64 `json:"len,omitempty"`
}

// Watch reports the changes under dir in the tree r names, as they
// happen, until ctx ends: inotify over the network (seeds/004's
// proposal). It reads a journal of its own, and walks and lists dir
// recursively so that the controller tells it of everything there;
// records map back to paths through the QIDs it walked.
func Watch(ctx context.Context, r p9net.Remote, opts Options, dir string, report func(Change)) error {
	w := &watcher{paths: map[uint64]string{}, qids: map[string]uint64{}, pending: map[uint64]string{}, tell: report, ctx: ctx}
	opts.newJournal, opts.CacheDir = true, ""
	if opts.CacheSize <= 0 {
		opts.CacheSize = cache.BlockSize
	}
	opts.onRecord = w.record
	root, err := New(ctx, stack.New(stack.Options{CoherenceOff: true}), r, opts)
	if err != nil {
		return err
	}
	n := root.(*node)
	defer n.fs.Close()
	if !n.fs.controller.Load() {
		return fmt.Errorf("9p server at %s has no journal controller: only shale serve can be watched", n.fs.where)
	}
	w.root = n
	dir = path.Clean("/" + dir)
	at, a, err := w.walk(dir)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.top = dir
	w.mu.Unlock()
	w.register(at, dir, &a)
	<-ctx.Done()
	return nil
}

type watcher struct {
	ctx  context.Context
	root *node
	tell func(Change) // Watch's report; through report

	out sync.Mutex // serializes report: deletes come from timers (watchkind.go)

	mu      sync.Mutex
	top     string
	paths   map[uint64]string // QID path → path
	qids    map[string]uint64 // path → QID path: the names the watch knows
	pending map[uint64]string // QID path → its name gone, maybe renamed (watchkind.go)
}

// walk looks p up from the root.
func (w *watcher) walk(p string) (layer.Node, layer.Attr, error) {
	var a layer.Attr
	var n layer.Node = w.root
	if e := n.Getattr(w.ctx, nil, &a); e != 0 {
		return nil, a, fmt.Errorf("stat /: %v", e)
	}
	for _, name := range strings.Split(strings.Trim(p, "/"), "/") {
		if name == "" {
			continue
		}
		next, e := n.Lookup(w.ctx, name, &a)
		if e != 0 {
			return nil, a, fmt.Errorf("%s: %v", p, e)
		}
		n = next
	}
	return n, a, nil
}

// register notes n as p, and what is beneath it: walking them makes the
// controller count them as cached by us.
func (w *watcher) register(n layer.Node, p string, a *layer.Attr) {
	w.mu.Lock()
	w.paths[n.Token().Ino] = p
	w.qids[p] = n.Token().Ino
	w.mu.Unlock()
	if !a.IsDir() {
		return
	}
	ds, e := n.OpenDir(w.ctx)
	if e != 0 {
		return
	}
	var names []string
	for {
		ent, ok, e := ds.Next(w.ctx)
		if e != 0 || !ok {
			break
		}
		if ent.Name != "." && ent.Name != ".." {
			names = append(names, ent.Name)
		}
	}
	ds.Close()
	for _, name := range names {
		var ca layer.Attr
		if ch, e := n.Lookup(w.ctx, name, &ca); e == 0 {
			w.register(ch, path.Join(p, name), &ca)
		}
	}
}

// record turns a journal record into changes.
func (w *watcher) record(r *journal.Record, _ []layer.Event) {
	w.mu.Lock()
	p, ok := w.paths[r.Qid.Path]
	top := w.top
	w.mu.Unlock()
	if r.Kind != journal.Change {
		// Everything was dropped, so nothing is registered: walk again.
		w.report(Change{Event: "reset", Path: top})
		if top != "" {
			if at, a, err := w.walk(top); err == nil {
				w.register(at, top, &a)
			}
		}
		return
	}
	if !ok {
		return
	}
	if !r.Known() {
		w.report(Change{Event: "change", Path: p})
		return
	}
	for _, f := range r.Fields {
		switch f.Type {
		case journal.Attrs:
			w.report(Change{Event: "attrib", Path: p})
		case journal.Data:
			w.report(Change{Event: "modify", Path: p, Off: f.Off, Len: f.Len})
		case journal.Entry:
			w.entry(path.Join(p, f.Name))
		default:
			w.report(Change{Event: "change", Path: p})
		}
	}
}

// ServerStats reads the statistics file of the journal tree of the
// server at r (shale serve's controller).
func ServerStats(ctx context.Context, r p9net.Remote, opts Options) ([]byte, error) {
	opts.CacheSize = -1 // no journal of our own
	root, err := New(ctx, stack.New(stack.Options{CoherenceOff: true}), r, opts)
	if err != nil {
		return nil, err
	}
	fs := root.(*node).fs
	defer fs.Close()
	c, e := fs.ss.Conn(ctx)
	if e != 0 {
		return nil, fmt.Errorf("9p server at %s: %v", fs.where, e)
	}
	rfid := c.NewFid()
	if err := c.AttachAs(rfid, identOf(ctx).uid, journal.Aname); err != nil {
		return nil, fmt.Errorf("9p server at %s has no journal controller (%v): only shale serve keeps statistics", fs.where, session.Errno(err))
	}
	defer c.Clunk(rfid)
	fid, _, err := c.Walk(rfid, []string{"stats"})
	if err != nil {
		return nil, fmt.Errorf("9p server at %s: no statistics file (%v)", fs.where, session.Errno(err))
	}
	defer c.Clunk(fid)
	if _, _, err := c.Lopen(fid, p9wire.WireFlags(unix.O_RDONLY)); err != nil {
		return nil, fmt.Errorf("9p server at %s: open statistics: %v", fs.where, session.Errno(err))
	}
	var out []byte
	buf := make([]byte, c.IOSize(0))
	for {
		k, err := c.ReadAt(fid, 0, buf, int64(len(out)))
		if err != nil {
			return nil, fmt.Errorf("9p server at %s: read statistics: %v", fs.where, session.Errno(err))
		}
		if k == 0 {
			return out, nil
		}
		out = append(out, buf[:k]...)
	}
}
