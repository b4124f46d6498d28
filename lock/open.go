package lock

import (
	"context"
	"slices"
	"sync"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Open is one open file's part in a Table: the owners that took locks
// through it. flock and OFD locks belong to the open file, and the
// kernel sends no unlock for them when it goes, so its Release drops
// them; a POSIX lock owner has flushed its locks before the last close,
// so dropping every owner then is safe. The zero Open is ready to use.
type Open struct {
	mu     sync.Mutex
	owners []openOwner
}

type openOwner struct {
	owner uint64
	flock bool
}

// Set is t.Set of tok's lock for owner, which o then remembers.
func (o *Open) Set(ctx context.Context, t *Table, tok layer.Token, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	e := t.Set(ctx, tok, owner, lk, wait)
	if e == 0 && lk.Type != syscall.F_UNLCK {
		w := openOwner{owner, lk.Flock}
		o.mu.Lock()
		if !slices.Contains(o.owners, w) {
			o.owners = append(o.owners, w)
		}
		o.mu.Unlock()
	}
	return e
}

// Flush drops owner's POSIX locks of tok, as any close by it does, and
// forgets it: Release must not drop ones it takes later through another
// open file.
func (o *Open) Flush(t *Table, tok layer.Token, owner uint64) {
	t.Release(tok, owner, false)
	o.mu.Lock()
	o.owners = slices.DeleteFunc(o.owners, func(w openOwner) bool { return w == openOwner{owner, false} })
	o.mu.Unlock()
}

// Release drops the locks of tok every owner took through o: the open
// file is going.
func (o *Open) Release(t *Table, tok layer.Token) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range o.owners {
		t.Release(tok, w.owner, w.flock)
	}
}
