package volume

import (
	"context"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
)

// watch turns the changes other clients make to the volume, as etcd's
// watch delivers them in order, into the stack's events: the kernel drops
// what it caches of them within one delivery, not a timeout. Changes of
// this client's own transactions are told already, by the operations
// that made them.
func (fs *FS) watch(ctx context.Context, rev int64) {
	for c := range fs.eng.Watch(ctx, fs.k.p, rev) {
		switch {
		case c.Up:
			go fs.sync(ctx)
			continue
		case c.Down:
			fs.meta.down()
			continue
		case c.Lost:
			fs.log.Warn("volume watch lost changes (compacted): dropping every cache", "volume", fs.f.Name, "rev", c.Rev)
			fs.meta.lost()
			fs.st.Events().Raise(layer.Event{Kind: layer.Everything})
			continue
		}
		fs.apply(c)
	}
}

// apply takes one change the watch delivered: into the metadata cache,
// and to the kernel as events unless it is this client's own.
func (fs *FS) apply(c Change) {
	mine := fs.isOwn(c.Rev)
	fs.meta.change(fs.k, c)
	if c.Key == fs.syncKey {
		fs.meta.marked(string(c.Val))
	}
	fs.mu.Lock()
	for r := range fs.own {
		if r < c.Rev {
			delete(fs.own, r) // the watch is past it
		}
	}
	fs.mu.Unlock()
	if mine || !fs.st.Events().Active() {
		return
	}
	kind, ino, name := fs.k.parse(c.Key)
	switch kind {
	case 'i':
		if c.Rev <= fs.toldUpTo(ino) {
			return // an open here read this version or a later one (sawData)
		}
		// An open file takes the change before the kernel learns of it:
		// a READ the kernel sends after would otherwise read the old
		// version, and size the file by it.
		var in *Inode
		if c.Val == nil {
			fs.gone(ino)
		} else if i, err := decodeInode(c.Val); err == nil && i.Mode&syscall.S_IFMT == syscall.S_IFREG {
			in = i
			fs.refresh(ino, in)
		}
		fs.st.Events().Raise(layer.Event{Kind: layer.Attrs, Token: token(ino)})
		if in != nil {
			fs.sawData(ino, in.DataVer, 0)
		}
	case 'd':
		fs.st.Events().Raise(layer.Event{Kind: layer.Entries, Token: token(ino), Name: name})
	case 'x':
		fs.st.Events().Raise(layer.Event{Kind: layer.Attrs, Token: token(ino)})
	}
}

// sync writes a new sync mark once the watch has (re)started: when the
// watch delivers it, it has delivered every change made before, and the
// metadata cache answers again.
func (fs *FS) sync(ctx context.Context) {
	nonce := newID()
	fs.meta.await(nonce)
	for pause := 100 * time.Millisecond; ctx.Err() == nil; pause = min(2*pause, 5*time.Second) {
		cctx, cancel := fs.ctx(ctx)
		lease, err := fs.eng.Lease(cctx)
		if err == nil {
			_, err = fs.eng.Txn(cctx, func(tx Tx) error {
				tx.PutLeased(fs.syncKey, []byte(nonce), lease)
				return nil
			})
		}
		cancel()
		if err == nil || !fs.meta.awaits(nonce) {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// gone marks ino's open file, if any, as removed by another client.
func (fs *FS) gone(ino uint64) {
	if f := fs.openFile(ino); f != nil {
		f.mu.Lock()
		f.gone = true
		f.mu.Unlock()
	}
}

// refresh gives an open file with nothing to write back the inode another
// client committed: its readers see the new data with the new size, as
// the kernel will, rather than at their next open only.
func (fs *FS) refresh(ino uint64, in *Inode) {
	f := fs.openFile(ino)
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A watch that lags may deliver a version older than an open read:
	// the data version orders them.
	if !f.changed && f.base != nil && f.cut < 0 && in.DataVer >= f.base.DataVer {
		f.base, f.size, f.mtime, f.ctime = in, in.Size, in.Mtime, in.Ctime
	}
}
