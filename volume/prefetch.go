package volume

import (
	"context"
	"sync"
	"time"

	"github.com/shalefs/shale/layer"
)

// prefetch keeps what a listing read — each entry and its inode, read in
// batches — for the lookups the kernel makes right after it (READDIRPLUS
// looks up every entry): one request per hundred entries instead of two
// per entry. Each entry serves one lookup, within prefetchFor, unless a
// change to its directory or inode (the stack's events: this client's own
// and, by the watch, others') drops it first. Its lock is taken alone.
type prefetch struct {
	mu    sync.Mutex
	ents  map[pkey]pent
	byIno map[uint64][]pkey
	gen   uint64 // counts drops: a batch read across one is not kept
}

type pkey struct {
	dir  uint64
	name string
}

type pent struct {
	d  Dirent
	in *Inode
	at time.Time
}

const (
	prefetchFor   = 2 * time.Second
	prefetchMax   = 100000 // entries kept at most
	prefetchBatch = 100    // inodes per request (etcd allows 128 operations)
)

func (p *prefetch) init() {
	p.ents = map[pkey]pent{}
	p.byIno = map[uint64][]pkey{}
}

// prefill reads the inodes of dir's entries and keeps them. A batch
// during whose reading any event came is not kept: the event may have
// been about one of them, and come before what it changed was read.
func (fs *FS) prefill(ctx context.Context, dir uint64, names []string, ents []Dirent) {
	for lo := 0; lo < len(ents); lo += prefetchBatch {
		hi := min(lo+prefetchBatch, len(ents))
		keys := make([]string, 0, hi-lo)
		for _, d := range ents[lo:hi] {
			keys = append(keys, fs.k.inode(d.Ino))
		}
		var vals [][]byte
		fs.pre.mu.Lock()
		gen := fs.pre.gen
		fs.pre.mu.Unlock()
		cctx, cancel := fs.ctx(ctx)
		_, err := fs.eng.Txn(cctx, func(tx Tx) (err error) {
			vals, err = tx.Get(keys...)
			return err
		})
		cancel()
		if err != nil {
			return // the lookups will read what they need
		}
		now := time.Now()
		fs.pre.mu.Lock()
		if fs.pre.gen != gen {
			fs.pre.mu.Unlock()
			continue
		}
		if len(fs.pre.ents) > prefetchMax {
			fs.pre.init()
		}
		for i, v := range vals {
			if v == nil {
				continue
			}
			in, err := decodeInode(v)
			if err != nil {
				continue
			}
			k := pkey{dir, names[lo+i]}
			d := ents[lo+i]
			fs.pre.ents[k] = pent{d, in, now}
			fs.pre.byIno[d.Ino] = append(fs.pre.byIno[d.Ino], k)
		}
		fs.pre.mu.Unlock()
	}
}

// take gives, once, what the last listing of dir read of name.
func (p *prefetch) take(dir uint64, name string) (Dirent, *Inode, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pkey{dir, name}
	e, ok := p.ents[k]
	if !ok {
		return Dirent{}, nil, false
	}
	p.forget(k, e.d.Ino)
	if time.Since(e.at) > prefetchFor {
		return Dirent{}, nil, false
	}
	return e.d, e.in, true
}

func (p *prefetch) forget(k pkey, ino uint64) {
	delete(p.ents, k)
	ks := p.byIno[ino]
	for i, o := range ks {
		if o == k {
			ks = append(ks[:i], ks[i+1:]...)
			break
		}
	}
	if len(ks) == 0 {
		delete(p.byIno, ino)
	} else {
		p.byIno[ino] = ks
	}
}

// drop forgets what an event makes stale: the entry it names, and
// whatever was read of its inode.
func (p *prefetch) drop(ev layer.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	if ev.Kind == layer.Everything {
		p.init()
		return
	}
	if ev.Kind == layer.Entries {
		if e, ok := p.ents[pkey{ev.Token.Ino, ev.Name}]; ok {
			p.forget(pkey{ev.Token.Ino, ev.Name}, e.d.Ino)
		}
	}
	for _, k := range append([]pkey(nil), p.byIno[ev.Token.Ino]...) {
		p.forget(k, ev.Token.Ino)
	}
}
