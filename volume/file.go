package volume

import (
	"context"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// fileState is a file open on this client: every handle and node of the
// file shares it, so that what one process writes another reads before it
// is written back. Writes stay here, in whole blocks, until the file is
// closed or synced (close-to-open, docs/volume.md), or dirtyMax of them
// wait; then the changed blocks go to S3 as new objects and the file's
// block list is swapped for the new one in one transaction.
type fileState struct {
	fs   *FS
	ino  uint64
	refs int // under fs.mu

	flushMu sync.Mutex // one write-back at a time

	mu      sync.Mutex
	base    *Inode           // as last read or committed
	size    uint64           // with the writes not written back
	mtime   int64            // likewise
	ctime   int64            //
	dirty   map[int64][]byte // block index -> its bytes (shorter: zeros follow)
	ver     map[int64]uint64 // seq of each dirty block's last change
	dbytes  int64
	cut     int64  // the least size truncated to since the last write-back; -1 none
	seq     uint64 // counts changes
	changed bool   // something to write back
	gone    bool   // the inode was removed
	orphan  bool   // its last link went while open here: removed at the last close
}

// maxSize is the largest file, ext4's with 4 KiB blocks: larger sizes are
// EFBIG, as there.
const maxSize = 1<<44 - 4096

// dirtyMax bounds the bytes a file keeps before it is written back.
const dirtyMax = 64 << 20

// openFile is ino's open file on this client, or nil.
func (fs *FS) openFile(ino uint64) *fileState {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.files[ino]
}

// acquire takes a reference to ino's open file, making it if need be. A
// file with nothing to write back is read again from etcd: an open sees
// what was written back before it (close-to-open); known, if not nil, is
// the inode as the caller just committed it (a create), read no again.
func (fs *FS) acquire(ctx context.Context, ino uint64, known *Inode) (*fileState, layer.Errno) {
	fs.mu.Lock()
	f := fs.files[ino]
	if f == nil {
		f = &fileState{fs: fs, ino: ino, dirty: map[int64][]byte{}, ver: map[int64]uint64{}, cut: -1}
		fs.files[ino] = f
	}
	f.refs++
	fs.mu.Unlock()
	f.mu.Lock()
	load := !f.changed
	f.mu.Unlock()
	if !load {
		return f, 0
	}
	in, mod, err := known, int64(0), error(nil)
	if in == nil {
		in, mod, err = fs.readInode(ctx, ino)
		// A read that started before the watch delivered a newer
		// version, which the kernel was told of, is made again: served,
		// the older one would have the kernel size the file by it.
		for tries := 0; err == nil && tries < 3 && in.DataVer < fs.servedVer(ino); tries++ {
			in, mod, err = fs.readInode(ctx, ino)
		}
	}
	if err == syscall.ENOENT {
		// Removed by another client under a name the kernel caches:
		// ESTALE has it look the path up again (close-to-open for names).
		err = syscall.ESTALE
	}
	if err != nil {
		fs.release(f)
		return nil, fs.errnoOf("open", err)
	}
	if in.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		fs.release(f)
		return nil, syscall.EISDIR
	}
	f.mu.Lock()
	if !f.changed && (f.base == nil || in.DataVer >= f.base.DataVer) {
		// Not an older read than another open's, or the watch's.
		f.base, f.size, f.mtime, f.ctime = in, in.Size, in.Mtime, in.Ctime
	}
	f.mu.Unlock()
	fs.sawData(ino, in.DataVer, mod)
	return f, 0
}

// release drops a reference; the last one forgets the file.
func (fs *FS) release(f *fileState) {
	f.mu.Lock()
	clean := !f.changed
	f.mu.Unlock()
	if !clean {
		// Flush wrote back at close: this is a write-back that failed.
		fs.log.Warn("volume file closed with data that could not be written back", "volume", fs.f.Name, "ino", f.ino)
	}
	fs.mu.Lock()
	f.refs--
	last := f.refs == 0 && fs.files[f.ino] == f
	if last {
		delete(fs.files, f.ino)
	}
	fs.mu.Unlock()
	f.mu.Lock()
	orphan := last && f.orphan
	f.mu.Unlock()
	if orphan {
		fs.reap(f.ino)
	}
}

// orphaned marks ino's open file as one whose last link went.
func (fs *FS) orphaned(ino uint64) {
	if f := fs.openFile(ino); f != nil {
		f.mu.Lock()
		f.orphan = true
		if f.base != nil {
			b := *f.base
			b.Nlink = 0
			f.base = &b
		}
		f.mu.Unlock()
	}
}

// reap removes an orphan at its last close here, if no link came back
// meanwhile (none can: link refuses an inode without links).
func (fs *FS) reap(ino uint64) {
	fs.update(context.Background(), "remove orphan", func(t *ntx) error {
		in, err := t.inode(ino)
		if err == syscall.ENOENT || err == nil && in.Nlink > 0 {
			return nil
		}
		if err != nil {
			return err
		}
		t.drop(ino)
		return nil
	})
}

// served is what this client's kernel may hold of a file: pages of data
// version dv at most; and nothing older than the inode's revision told,
// which an open read and had the kernel drop what it held before.
type served struct {
	dv   uint64
	told int64
}

// sawData records data version dv of ino, served now: as an open read
// it at revision mod, or as the watch delivered it or the open's create
// made it (mod 0). The kernel may hold the size and pages of an older
// version (from a lookup, or a read before the change) that the watch
// has not dropped yet: they are dropped before the open that found the
// new one returns. An older version than one served is no news: the watch
// lags behind the open, and what it then delivers of versions up to told
// is not told to the kernel (FS.apply): an invalidation racing with the
// getattr that fetches the new size has the kernel keep the old size and
// read that many bytes.
func (fs *FS) sawData(ino, dv uint64, mod int64) {
	fs.mu.Lock()
	s, ok := fs.seen[ino]
	tell := ok && dv > s.dv || !ok && mod != 0
	if !ok || dv > s.dv {
		s.dv = dv
	}
	if tell {
		s.told = max(s.told, mod)
	}
	fs.seen[ino] = s
	fs.mu.Unlock()
	if tell && fs.st.Events().Active() {
		fs.st.Events().Raise(layer.Event{Kind: layer.Data, Token: token(ino)})
	}
}

// servedVer is the newest data version of ino this client knows of.
func (fs *FS) servedVer(ino uint64) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.seen[ino].dv
}

// toldUpTo is the inode revision up to which ino's changes are known to
// the kernel (served.told).
func (fs *FS) toldUpTo(ino uint64) int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.seen[ino].told
}

// attr fills out with the file as this client sees it, if that is not
// what etcd says: data not written back, or an open file removed.
func (f *fileState) attr(ctx context.Context, out *layer.Attr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.base == nil || !f.changed && !f.gone {
		return false
	}
	in := *f.base
	in.Size, in.Mtime, in.Ctime = f.size, f.mtime, f.ctime
	f.fs.fill(f.ino, &in, out)
	if f.gone {
		out.Nlink = 0
	}
	return true
}

// setTimes takes the attributes a Setattr committed, so that a later
// write-back keeps them (a utimes after a write, as cp -p does).
func (f *fileState) setTimes(res *Inode, in *layer.SetAttr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.base == nil {
		return
	}
	b := *f.base
	b.Mode, b.Uid, b.Gid, b.Atime = res.Mode, res.Uid, res.Gid, res.Atime
	f.base = &b
	f.ctime = res.Ctime
	if in.Valid&(layer.SetMtime|layer.SetMtimeNow) != 0 {
		f.mtime = res.Mtime
	}
}

func (f *fileState) bs() int64 { return int64(f.fs.f.BlockSize) }

// baseBlock is block i as etcd has it, unless a truncation since the last
// write-back dropped it. Under f.mu.
func (f *fileState) baseBlock(i int64) Block {
	if f.base == nil || i >= int64(len(f.base.Blocks)) || f.cut >= 0 && i*f.bs() >= f.cut {
		return Block{}
	}
	return f.base.Blocks[i]
}

// fetch reads a stored block's bytes that count.
func (f *fileState) fetch(ctx context.Context, b Block) ([]byte, layer.Errno) {
	if b.ID == "" {
		return nil, 0
	}
	ctx, cancel := f.fs.ctx(ctx)
	defer cancel()
	data, err := f.fs.blocks.get(ctx, b.ID, int(b.Len))
	if err != nil {
		return nil, f.fs.errnoOf("read block", err)
	}
	if int64(len(data)) > int64(b.Len) {
		data = data[:b.Len]
	}
	return data, 0
}

func (f *fileState) read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	bs := f.bs()
	f.mu.Lock()
	size := int64(f.size)
	if off >= size {
		f.mu.Unlock()
		return 0, 0
	}
	end := min(off+int64(len(dest)), size)
	type fetch struct {
		i int64
		b Block
	}
	var todo []fetch
	clear(dest[:end-off])
	for i := off / bs; i*bs < end; i++ {
		if buf, ok := f.dirty[i]; ok {
			copyPart(dest, off, end, i*bs, buf)
		} else if b := f.baseBlock(i); b.ID != "" {
			todo = append(todo, fetch{i, b})
		}
	}
	f.mu.Unlock()
	// The objects never change: fetched without the lock.
	for _, t := range todo {
		data, e := f.fetch(ctx, t.b)
		if e != 0 {
			return 0, e
		}
		copyPart(dest, off, end, t.i*bs, data)
	}
	return int(end - off), 0
}

// copyPart copies into dest (the bytes [off, end) of the file) what of
// data (bytes from start) falls in that range.
func copyPart(dest []byte, off, end, start int64, data []byte) {
	lo, hi := max(off, start), min(end, start+int64(len(data)))
	if lo < hi {
		copy(dest[lo-off:hi-off], data[lo-start:hi-start])
	}
}

func (f *fileState) write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	bs := f.bs()
	end := off + int64(len(data))
	if end > maxSize {
		return 0, syscall.EFBIG
	}
	for i := off / bs; i*bs < end; i++ {
		start := i * bs
		lo, hi := max(off, start)-start, min(end, start+bs)-start
		f.mu.Lock()
		_, have := f.dirty[i]
		b := f.baseBlock(i)
		f.mu.Unlock()
		var old []byte
		if !have && b.ID != "" && (lo > 0 || hi < int64(b.Len)) {
			// Part of a stored block: read what the write keeps of it.
			var e layer.Errno
			if old, e = f.fetch(ctx, b); e != 0 {
				return 0, e
			}
		}
		f.mu.Lock()
		buf, have := f.dirty[i]
		if !have {
			buf = slices.Clone(old)
		}
		f.dbytes -= int64(len(buf))
		if int64(len(buf)) < hi {
			buf = append(buf, make([]byte, hi-int64(len(buf)))...)
		}
		copy(buf[lo:hi], data[start+lo-off:start+hi-off])
		f.dbytes += int64(len(buf))
		f.seq++
		f.dirty[i], f.ver[i] = buf, f.seq
		f.mu.Unlock()
	}
	f.mu.Lock()
	f.size = max(f.size, uint64(end))
	now := nowNs()
	f.mtime, f.ctime, f.changed = now, now, true
	f.seq++
	over := f.dbytes > dirtyMax
	f.mu.Unlock()
	if over {
		if e := f.writeBack(ctx); e != 0 {
			return 0, e
		}
	}
	return len(data), 0
}

// truncate sets the size; the block it now ends in keeps only the bytes
// below it, and those above are dropped at the write-back.
func (f *fileState) truncate(ctx context.Context, size uint64) layer.Errno {
	if size > maxSize {
		return syscall.EFBIG
	}
	bs := f.bs()
	i, r := int64(size)/bs, int64(size)%bs
	f.mu.Lock()
	shrink := size < f.size
	_, have := f.dirty[i]
	b := f.baseBlock(i)
	f.mu.Unlock()
	var old []byte
	if shrink && r != 0 && !have && b.ID != "" {
		var e layer.Errno
		if old, e = f.fetch(ctx, b); e != 0 {
			return e
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if shrink {
		for j, buf := range f.dirty {
			if j > i || j == i && r == 0 {
				f.dbytes -= int64(len(buf))
				delete(f.dirty, j)
				delete(f.ver, j)
			}
		}
		if r != 0 {
			buf, have := f.dirty[i]
			if !have {
				buf = slices.Clone(old)
			}
			if int64(len(buf)) > r {
				f.dbytes -= int64(len(buf)) - r
				buf = buf[:r]
			}
			if have || old != nil {
				f.seq++
				f.dirty[i], f.ver[i] = buf, f.seq
			}
		}
		if f.cut < 0 || int64(size) < f.cut {
			f.cut = int64(size)
		}
	}
	f.size = size
	now := nowNs()
	f.mtime, f.ctime, f.changed = now, now, true
	f.seq++
	return 0
}

// zero makes [off, end) of the file read as zeros, within its size:
// whole blocks become holes, parts of blocks are written with zeros.
func (f *fileState) zero(ctx context.Context, off, end int64) layer.Errno {
	bs := f.bs()
	f.mu.Lock()
	end = min(end, int64(f.size))
	f.mu.Unlock()
	for i := off / bs; i*bs < end; i++ {
		start := i * bs
		lo, hi := max(off, start), min(end, start+bs)
		if lo == start && hi == start+bs {
			f.mu.Lock()
			f.dbytes -= int64(len(f.dirty[i]))
			f.seq++
			f.dirty[i], f.ver[i] = []byte{}, f.seq
			f.changed = true
			f.mu.Unlock()
			continue
		}
		if _, e := f.write(ctx, make([]byte, hi-lo), lo); e != 0 {
			return e
		}
	}
	f.mu.Lock()
	now := nowNs()
	f.mtime, f.ctime, f.changed = now, now, true
	f.mu.Unlock()
	return 0
}

// seek finds the next data or hole at or after off, by blocks.
func (f *fileState) seek(off int64, whence int) (int64, layer.Errno) {
	bs := f.bs()
	f.mu.Lock()
	defer f.mu.Unlock()
	size := int64(f.size)
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if off >= size {
		return 0, syscall.ENXIO
	}
	isData := func(i int64) bool {
		if buf, ok := f.dirty[i]; ok {
			return len(buf) > 0
		}
		return f.baseBlock(i).ID != ""
	}
	for i := off / bs; i*bs < size; i++ {
		if isData(i) == (whence == unix.SEEK_DATA) {
			return max(off, i*bs), 0
		}
	}
	if whence == unix.SEEK_DATA {
		return 0, syscall.ENXIO
	}
	return size, 0
}
