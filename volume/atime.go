package volume

import (
	"context"
	"time"

	"github.com/shalefs/shale/layer"
)

// Access times follow Linux's relatime: a read or a listing sets atime
// when it is not later than mtime or ctime, or a day old; so a file read
// over and over costs one transaction after each change, not one per
// read. The update is made at the open for reading (the kernel serves
// reads from its page cache without asking), before the open returns, so
// that a stat after the read shows it.

func relatime(in *Inode, now int64) bool {
	return in.Atime <= in.Mtime || in.Atime <= in.Ctime || now-in.Atime >= int64(24*time.Hour)
}

// accessed sets ino's atime if relatime asks for it; known is the inode
// as the caller last saw it, to skip the transaction when it does not.
func (fs *FS) accessed(ino uint64, known *Inode) {
	if known == nil || !relatime(known, nowNs()) {
		return
	}
	func() {
		set := false
		e := fs.update(context.Background(), "atime", func(t *ntx) error {
			set = false
			in, err := t.inode(ino)
			if err != nil || !relatime(in, t.now) {
				return err
			}
			in.Atime, set = t.now, true
			t.touch(ino, 0)
			return nil
		})
		if e != 0 || !set {
			return
		}
		if f := fs.openFile(ino); f != nil {
			f.mu.Lock()
			if f.base != nil {
				b := *f.base
				b.Atime = nowNs()
				f.base = &b
			}
			f.mu.Unlock()
		}
		// Every view, this one's too: its kernel keeps the old atime.
		fs.st.Events().Raise(layer.Event{Kind: layer.Attrs, Token: token(ino)})
	}()
}
