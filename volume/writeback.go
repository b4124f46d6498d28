package volume

import (
	"context"
	"slices"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// writeBack stores the changed blocks as new objects and swaps the file's
// block list, size and times in one transaction. Writes may go on while
// it works: what they change after its snapshot stays dirty.
func (f *fileState) writeBack(ctx context.Context) layer.Errno {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	f.mu.Lock()
	if !f.changed {
		f.mu.Unlock()
		return 0
	}
	snap := make(map[int64][]byte, len(f.dirty))
	vers := make(map[int64]uint64, len(f.dirty))
	for i, buf := range f.dirty {
		snap[i], vers[i] = slices.Clone(buf), f.ver[i]
	}
	seq, size, mtime, ctime, cut := f.seq, f.size, f.mtime, f.ctime, f.cut
	baseDV := uint64(0)
	if f.base != nil {
		baseDV = f.base.DataVer
	}
	f.cut = -1
	f.mu.Unlock()

	restoreCut := func() {
		f.mu.Lock()
		if cut >= 0 && (f.cut < 0 || cut < f.cut) {
			f.cut = cut
		}
		f.mu.Unlock()
	}
	cctx, cancel := f.fs.ctx(ctx)
	defer cancel()
	put, err := f.fs.blocks.putAll(cctx, snap)
	if err != nil {
		restoreCut()
		return f.fs.errnoOf("write block", err)
	}

	bs := f.bs()
	var committed *Inode
	gone := false
	e := f.fs.update(ctx, "write back", func(t *ntx) error {
		committed, gone = nil, false
		cur, err := t.inode(f.ino)
		if err == syscall.ENOENT {
			gone = true // removed: its data goes with it
			return nil
		}
		if err != nil {
			return err
		}
		list := slices.Clone(cur.Blocks)
		if cut >= 0 {
			n := (cut + bs - 1) / bs
			for j := n; j < int64(len(list)); j++ {
				list[j] = Block{}
			}
		}
		for i, b := range put {
			for int64(len(list)) <= i {
				list = append(list, Block{})
			}
			list[i] = b
		}
		sz := size
		if cur.DataVer != baseDV && cut < 0 {
			// Another client wrote back since we read the file: block by
			// block, the last write-back wins; the file is the longer.
			sz = max(sz, cur.Size)
		}
		nb := (int64(sz) + bs - 1) / bs
		if int64(len(list)) > nb {
			list = list[:nb]
		}
		for len(list) > 0 && list[len(list)-1].ID == "" {
			list = list[:len(list)-1]
		}
		keep := map[string]bool{}
		for _, b := range list {
			keep[b.ID] = true
		}
		for _, b := range cur.Blocks {
			if b.ID != "" && !keep[b.ID] {
				t.freed = append(t.freed, b.ID)
			}
		}
		cur.Blocks, cur.Size, cur.Mtime, cur.Ctime = list, sz, mtime, ctime
		cur.DataVer++
		t.touch(f.ino, 0)
		c := *cur
		committed = &c
		return nil
	})
	if e != 0 {
		restoreCut()
		return e
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if gone {
		f.gone, f.changed = true, false
		clear(f.dirty)
		clear(f.ver)
		f.dbytes = 0
		return 0
	}
	f.base = committed
	for i, v := range vers {
		if f.ver[i] == v {
			f.dbytes -= int64(len(f.dirty[i]))
			delete(f.dirty, i)
			delete(f.ver, i)
		}
	}
	if f.seq == seq {
		f.changed = false
		f.size = committed.Size
	}
	f.fs.mu.Lock()
	s := f.fs.seen[f.ino]
	s.dv = committed.DataVer
	f.fs.seen[f.ino] = s
	f.fs.mu.Unlock()
	return 0
}
