package volume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/objstore"
)

// The disk cache (--cache-dir DIR): blocks in an object store (objstore,
// the CFS design) in DIR/blocks, one object a block, keyed by the block's
// id. Blocks are written once and never changed, so an entry never needs
// invalidating: a block the volume no longer uses is simply never asked
// for again and ages out. The store is one preallocated file, so its size
// is the bound, and replacement (SIEVE) keeps the blocks read most.
//
// What it must never do is serve wrong bytes or fail a read: objstore
// checks every object's key and a CRC-32C over it, so a torn, truncated
// or overwritten entry is a miss; get also refuses a block shorter than
// the file's block list says it holds. Any error of the disk is a miss
// too, and the block comes from S3 as it would without the cache. A disk
// too full for the store at mount runs without one (said in the log).
//
// The index lives in memory and is saved at a clean close (unmount); a
// mount that was killed leaves a store whose every entry is a miss.
type diskCache struct {
	st  *objstore.Store
	dir string
}

const diskCacheFile = "blocks"

// openBlocks reaches the volume's bucket and opens its caches: in memory,
// and on disk with o.CacheDir. With a disk cache, an S3 server that does
// not answer at mount is no error: what the cache holds is read, and the
// rest waits for the server, as when it goes away later.
func openBlocks(ctx context.Context, f Format, o Options) (*blockStore, error) {
	d, err := ParseDataURL(f.Data)
	if err != nil {
		return nil, err
	}
	const memMax = 256 << 20
	mem := cmp.Or(o.CacheSize, memMax)
	if o.CacheDir != "" {
		mem = min(mem, memMax)
	}
	bs, err := newBlockStore(ctx, d, f.Compression, mem)
	if err != nil {
		return nil, err
	}
	if o.CacheDir != "" {
		if bs.disk, err = openDiskCache(o.CacheDir, cmp.Or(o.CacheSize, memMax), o.Logger); err != nil {
			return nil, err
		}
	}
	err = bs.check(ctx)
	if errors.Is(err, errUnreachable) && bs.disk != nil {
		o.Logger.Warn("S3 does not answer: reading what the block cache holds, the rest waits for it", "data", d, "err", err)
		return bs, nil
	}
	if err != nil {
		bs.close()
		return nil, err
	}
	return bs, nil
}

// freeReserve is the part of the file system a cache leaves free: a
// cache that took the last of a disk would make everything else on it
// fail, the opposite of what a cache is for.
const freeReserve = 10 // percent

// minDiskCache is the smallest store worth having; maxDiskCache is near
// the largest objstore makes (2 TiB).
const (
	minDiskCache = 1 << 20
	maxDiskCache = 2<<40 - 1<<20
)

// openDiskCache opens (or makes) the cache in dir, of at most size bytes.
// It returns nil and no error when the disk has no room for one: the
// volume then runs without, as the log says. A store another mount owns
// is an error: two mounts may not share a directory.
func openDiskCache(dir string, size int64, log *slog.Logger) (*diskCache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
	}
	path := filepath.Join(dir, diskCacheFile)
	var have int64
	if fi, err := os.Stat(path); err == nil {
		have = fi.Size()
	}
	want, err := roomFor(dir, size, have)
	if err != nil {
		return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
	}
	if have > 0 {
		// The store there is kept if it is within what may be used now
		// (a smaller one left by a fuller disk is still good).
		st, err := objstore.Open(path, objstore.Options{})
		switch {
		case errors.Is(err, objstore.ErrInUse):
			return nil, fmt.Errorf("--cache-dir %s: %v: give each mount a directory of its own", dir, err)
		case err != nil:
			log.Warn("block cache unreadable: making a new one", "file", path, "err", err)
		case have > size || have < want && want-have > want/8:
			// Too big for the bound, or well short of the room given:
			// the cache is made again at the size asked for.
			st.Close()
		default:
			return &diskCache{st: st, dir: dir}, nil
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
		}
	}
	if want < minDiskCache {
		log.Warn("no room for the block cache: running without it", "dir", dir, "asked", size, "room", want)
		return nil, nil
	}
	st, err := objstore.Format(path, want, objstore.Options{})
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		log.Warn("no room for the block cache: running without it", "dir", dir, "asked", size, "err", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
	}
	if want < size {
		log.Info("block cache smaller than asked: the disk is short of room", "dir", dir, "asked", size, "size", want)
	}
	return &diskCache{st: st, dir: dir}, nil
}

// roomFor is how big a store in dir may be: size, or less where that would
// leave under freeReserve of the file system free. have is the store
// already there, whose space counts as free.
func roomFor(dir string, size, have int64) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return 0, err
	}
	bs := int64(s.Bsize)
	free := int64(s.Bavail)*bs + have
	keep := int64(s.Blocks) * bs * freeReserve / 100
	return max(0, min(size, free-keep, maxDiskCache)), nil
}

// get returns block id if the cache holds all of it: at least want bytes.
// A shorter entry goes, so that the block fetched again takes its place.
func (d *diskCache) get(id string, want int) ([]byte, bool) {
	b, err := d.st.Read(id)
	if err != nil {
		return nil, false
	}
	if len(b) < want {
		d.st.Remove(id)
		return nil, false
	}
	return b, true
}

// add keeps block id. data must not change afterwards (blocks never do).
// A block that does not fit, or a write the disk fails, is only a miss
// later, never an error now.
func (d *diskCache) add(id string, data []byte) {
	if _, err := d.st.Length(id); err == nil {
		return // there already: ids are never reused
	}
	d.st.Create(id, data)
}

func (d *diskCache) drop(id string) { d.st.Remove(id) }

// close saves the index, so that the next mount finds the blocks.
func (d *diskCache) close() error {
	if err := d.st.Close(); err != nil {
		return fmt.Errorf("--cache-dir %s: closing the block cache: %v", d.dir, err)
	}
	return nil
}
