package volume

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/objstore"
	"github.com/shalefs/shale/stack"
)

// mountCached opens the volume with its disk cache in dir, bounded by
// size; close unmounts it (saving the cache's index), as often as called.
func mountCached(t testing.TB, lower, dir string, size int64) (fs *FS, root layer.Node, close func()) {
	t.Helper()
	u, err := ParseURL(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs, root, err = Open(context.Background(), stack.New(stack.Options{}), u, Options{CacheDir: dir, CacheSize: size})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	close = func() {
		once.Do(func() {
			if err := fs.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(close)
	return fs, root, close
}

// dropFromS3 removes every block of the volume from the bucket, behind
// the client's back: what it reads afterwards can only come from a cache.
func dropFromS3(t testing.TB, fs *FS) int {
	t.Helper()
	s := fs.blocks
	n := 0
	for o := range s.c.ListObjects(context.Background(), s.d.Bucket, minio.ListObjectsOptions{Prefix: s.blocksPrefix(), Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if err := s.c.RemoveObject(context.Background(), s.d.Bucket, o.Key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// pattern is n bytes that differ from block to block and file to file.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/7) ^ seed ^ byte(i>>12)
	}
	return b
}

// TestDiskCacheRemount: blocks written by one mount are on disk for the
// next, which reads them with the bucket emptied behind its back.
func TestDiskCacheRemount(t *testing.T) {
	lower := testVolume(t, 16<<10)
	dir := t.TempDir()
	data := pattern(1, 5*16<<10+300) // six blocks, the last short
	_, root, close1 := mountCached(t, lower, dir, 8<<20)
	writeFile(t, root, "f", data)
	close1()

	fs, root, _ := mountCached(t, lower, dir, 8<<20)
	if n := dropFromS3(t, fs); n < 6 {
		t.Fatalf("removed %d objects from S3, want the file's 6 at least", n)
	}
	if got := readFile(t, lookup(t, root, "f")); !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes with the blocks gone from S3, want the %d cached on disk", len(got), len(data))
	}
	if fs.blocks.disk == nil {
		t.Fatal("no disk cache")
	}
	if st := fs.blocks.disk.st.Stats(); st.Hits < 6 {
		t.Errorf("disk cache hits %d, want 6", st.Hits)
	}
}

// TestDiskCacheCorrupt: a cache entry whose bytes were changed on disk, a
// store cut short, or an entry shorter than the block (whole by its
// checksum) is never served: the block comes from S3 again, and is cached
// anew.
func TestDiskCacheCorrupt(t *testing.T) {
	lower := testVolume(t, 16<<10)
	for _, how := range []string{"flip", "truncate", "short"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			data := pattern(2, 3*16<<10)
			fs, root, close1 := mountCached(t, lower, dir, 8<<20)
			f := writeFile(t, root, how, data)
			in, err := fs.getInode(ctx0, f.(*node).ino)
			if err != nil {
				t.Fatal(err)
			}
			close1()

			path := filepath.Join(dir, diskCacheFile)
			store, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "flip":
				// One byte in the middle of the second block.
				i := bytes.Index(store, data[16<<10:16<<10+4096])
				if i < 0 {
					t.Fatal("the block's bytes are not in the store")
				}
				store[i+2000] ^= 0x55
				err = os.WriteFile(path, store, 0o600)
			case "truncate":
				err = os.Truncate(path, int64(len(store))/2)
			case "short":
				var st *objstore.Store
				if st, err = objstore.Open(path, objstore.Options{}); err == nil {
					st.Create(in.Blocks[1].ID, data[16<<10:16<<10+100])
					err = st.Close()
				}
			}
			if err != nil {
				t.Fatal(err)
			}

			fs, root, close2 := mountCached(t, lower, dir, 8<<20)
			if got := readFile(t, lookup(t, root, how)); !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, not what was written: a corrupt cache entry was served", len(got))
			}
			// What came from S3 is cached again, whole.
			dropFromS3(t, fs)
			close2()
			_, root, _ = mountCached(t, lower, dir, 8<<20)
			if got := readFile(t, lookup(t, root, how)); !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes from the cache refilled after the corruption, want %d", len(got), len(data))
			}
		})
	}
}

// TestDiskCacheBound: writing four times the cache's size leaves the
// cache file at its size, the newest blocks in it.
func TestDiskCacheBound(t *testing.T) {
	lower := testVolume(t, 64<<10)
	dir := t.TempDir()
	const size = 2 << 20
	fs, root, close1 := mountCached(t, lower, dir, size)
	for i := range 4 {
		writeFile(t, root, string(rune('a'+i)), pattern(byte(i), size))
	}
	last := pattern(9, 256<<10)
	writeFile(t, root, "last", last)
	if fs.blocks.disk == nil {
		t.Fatal("no disk cache")
	}
	if ev := fs.blocks.disk.st.Stats().Evictions; ev == 0 {
		t.Error("no block was evicted")
	}
	close1()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, diskCacheFile), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size > size || st.Blocks*512 > size {
		t.Fatalf("the cache takes %d bytes (%d on disk), over its bound of %d", st.Size, st.Blocks*512, size)
	}
	fs, root, _ = mountCached(t, lower, dir, size)
	dropFromS3(t, fs)
	if got := readFile(t, lookup(t, root, "last")); !bytes.Equal(got, last) {
		t.Fatalf("the newest file: %d bytes from the disk cache, want %d", len(got), len(last))
	}
}

// TestDiskCacheNoRoom: on a file system with no room for the cache the
// volume runs without one: reads and writes work, nothing is cached on
// disk, and nothing fills the disk further.
func TestDiskCacheNoRoom(t *testing.T) {
	lower := testVolume(t, 16<<10)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("mounting a small tmpfs: %v (run as root)", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	// Fill it to within 512 KiB.
	fill := make([]byte, 4<<20-512<<10)
	if err := os.WriteFile(filepath.Join(dir, "fill"), fill, 0o600); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	fs, root, _ := mountCached(t, lower, cache, 64<<20)
	if fs.blocks.disk != nil {
		t.Fatal("a disk cache was made with no room for it")
	}
	data := pattern(3, 40000)
	if got := readFile(t, writeFile(t, root, "f", data)); !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes", len(got))
	}
	if _, err := os.Stat(filepath.Join(cache, diskCacheFile)); !os.IsNotExist(err) {
		t.Fatalf("a cache file with no room for it: %v", err)
	}

	// With the room freed the next mount has a cache, smaller than asked
	// for, so that a tenth of the disk stays free.
	if err := os.Remove(filepath.Join(dir, "fill")); err != nil {
		t.Fatal(err)
	}
	fs, _, _ = mountCached(t, lower, cache, 64<<20)
	if fs.blocks.disk == nil {
		t.Fatal("no disk cache with the room for one")
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(dir, &sf); err != nil {
		t.Fatal(err)
	}
	if free := int64(sf.Bavail) * int64(sf.Bsize); free < int64(sf.Blocks)*int64(sf.Bsize)/10-4096 {
		t.Fatalf("the cache left %d bytes free of %d", free, int64(sf.Blocks)*int64(sf.Bsize))
	}
}
