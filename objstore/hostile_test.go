package objstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Hostile files: a superblock or saved index crafted with valid checksums
// but fields out of range must give a one-line error or an empty index,
// never a panic, a huge allocation or an index read from the wrong place.

// hostileStore formats a 64 KiB store, stores a few objects, closes it
// cleanly and returns the file's bytes.
func hostileStore(t testing.TB) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	s, err := Format(path, 64<<10, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "bb", "ccc"} {
		if err := s.Create(k, Generate(k, 700)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// resum recomputes the superblock checksum of an image.
func resum(img []byte) {
	binary.LittleEndian.PutUint32(img[76:], crc32.Checksum(img[:76], castagnoli))
}

func writeImage(t testing.TB, img []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// allocated returns the bytes fn allocates.
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// maxOpenAlloc bounds what opening a 64 KiB store may allocate.
const maxOpenAlloc = 32 << 20

// TestHostileSuperblock crafts superblocks whose geometry is out of range.
// Open must fail with a one-line ErrCorrupt.
func TestHostileSuperblock(t *testing.T) {
	good := hostileStore(t)
	le := binary.LittleEndian
	for _, c := range []struct {
		name string
		edit func([]byte)
		want string
	}{
		{"blocks wrap the byte count", func(b []byte) { le.PutUint64(b[16:], 1<<55) }, "data blocks"},
		{"blocks wrap uint32", func(b []byte) { le.PutUint64(b[16:], 1<<32+100) }, "data blocks"},
		{"blocks too few", func(b []byte) { le.PutUint64(b[16:], 3) }, "data blocks"},
		{"blocks past the device", func(b []byte) { le.PutUint64(b[16:], 200) }, "device"},
		{"unknown state", func(b []byte) { le.PutUint32(b[24:], 7) }, "state"},
	} {
		t.Run(c.name, func(t *testing.T) {
			img := append([]byte(nil), good...)
			c.edit(img)
			resum(img)
			var err error
			n := allocated(func() {
				var s *Store
				if s, err = Open(writeImage(t, img), Options{}); err == nil {
					s.Close()
				}
			})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("open: %v, want one line of ErrCorrupt mentioning %q", err, c.want)
			}
			if n > maxOpenAlloc {
				t.Errorf("open allocated %d bytes", n)
			}
		})
	}
}

// hostileIndexCases craft the saved index's place, length and entries.
// Each returns the image to open.
func hostileIndexCases(good []byte) []struct {
	name string
	img  []byte
} {
	le := binary.LittleEndian
	idxBlock, idxBytes := le.Uint64(good[32:]), le.Uint64(good[40:])
	idxOff := (superBlocks + idxBlock) * blockSize
	blob := good[idxOff : idxOff+idxBytes]
	var out []struct {
		name string
		img  []byte
	}
	add := func(name string, edit func(b []byte)) {
		img := append([]byte(nil), good...)
		edit(img)
		resum(img)
		out = append(out, struct {
			name string
			img  []byte
		}{name, img})
	}
	// Lengths that wrap blocksFor's uint32 or int64.
	add("length 2 TiB", func(b []byte) { le.PutUint64(b[40:], 1<<41) })
	add("length negative as int64", func(b []byte) { le.PutUint64(b[40:], 1<<63+1<<41) })
	add("length past the store", func(b []byte) { le.PutUint64(b[40:], 1<<20) })
	add("length not whole entries", func(b []byte) { le.PutUint64(b[40:], idxBytes-3) })
	// A block number that wraps back into the superblock area, where a
	// copy of the real index is planted: it must not be read from there.
	add("block wraps into the superblock", func(b []byte) {
		copy(b[7*blockSize:], blob)
		le.PutUint64(b[32:], ^uint64(0))
	})
	add("block past the store", func(b []byte) { le.PutUint64(b[32:], 1<<40) })
	// Entries with valid checksums but out of range.
	entry := func(name string, edit func(e []byte)) {
		add(name, func(b []byte) {
			e := b[idxOff : idxOff+indexEntSize]
			edit(e)
			le.PutUint32(b[48:], crc32.Checksum(b[idxOff:idxOff+idxBytes], castagnoli))
		})
	}
	entry("entry block wraps", func(e []byte) { le.PutUint32(e[8:], ^uint32(0)) })
	entry("entry size huge", func(e []byte) { le.PutUint32(e[12:], ^uint32(0)) })
	entry("entry size zero", func(e []byte) { le.PutUint32(e[12:], 0) })
	entry("entry size between layouts", func(e []byte) { le.PutUint32(e[12:], pageSize+directMin-1) })
	entry("entry overlaps the next", func(e []byte) { le.PutUint32(e[12:], 3*blockSize) })
	add("key listed twice", func(b []byte) {
		copy(b[idxOff+indexEntSize:], b[idxOff:idxOff+8])
		le.PutUint32(b[48:], crc32.Checksum(b[idxOff:idxOff+idxBytes], castagnoli))
	})
	add("index checksum", func(b []byte) { b[idxOff+3] ^= 0x55 })
	return out
}

// TestHostileIndex opens stores whose saved index is crafted: Open must not
// panic or allocate more than the store could need, and must not load it;
// it drops the index, logs it, and the store works.
func TestHostileIndex(t *testing.T) {
	good := hostileStore(t)
	for _, c := range hostileIndexCases(good) {
		t.Run(c.name, func(t *testing.T) {
			path := writeImage(t, c.img)
			log := captureLog(t)
			var s *Store
			var err error
			n := allocated(func() { s, err = Open(path, Options{}) })
			if n > maxOpenAlloc {
				t.Errorf("open allocated %d bytes", n)
			}
			checkDropped(t, s, err, log)
		})
	}
}

// checkDropped checks the outcome of opening a store whose saved index is
// corrupt: the index is dropped as after a crash, one line is logged, and
// the store works.
func checkDropped(t *testing.T, s *Store, err error, log *bytes.Buffer) {
	t.Helper()
	if err != nil {
		t.Fatalf("open with a corrupt saved index: %v, want the index dropped", err)
	}
	defer s.Close()
	if st := s.Stats(); st.Objects != 0 || st.CleanOpen || st.Used != 0 {
		t.Fatalf("corrupt index not dropped: %+v", st)
	}
	if lines := strings.Count(log.String(), "\n"); lines != 1 || !strings.Contains(log.String(), "store=") ||
		!strings.Contains(log.String(), "corrupt") {
		t.Fatalf("log: %q, want one line naming the store and the damage", log.String())
	}
	if _, err := s.Read("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read after dropping the index: %v, want a miss", err)
	}
	data := Generate("new", 20000)
	if err := s.Create("new", data); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read("new"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back after dropping the index: %v", err)
	}
}

// captureLog sends slog.Default to a buffer until the test ends.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}
