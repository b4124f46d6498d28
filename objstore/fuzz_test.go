package objstore

import (
	"encoding/binary"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
)

// The fuzz targets open a 64 KiB store whose superblock or saved index is
// the fuzzer's bytes, with the checksums recomputed so that the checks past
// them run. Open must not panic or allocate more than the store could need;
// it either fails with a one-line error or gives a store that works. Seed
// corpora are in testdata/fuzz. CI runs them bounded, e.g.
//
//	go test -run='^$' -fuzz='^FuzzSuperblock$' -fuzztime=10s ./objstore/
//	go test -run='^$' -fuzz='^FuzzSavedIndex$' -fuzztime=10s ./objstore/

var fuzzImage struct {
	once sync.Once
	img  []byte
}

// fuzzTemplate is a cleanly closed store holding three objects.
func fuzzTemplate(t testing.TB) []byte {
	fuzzImage.once.Do(func() { fuzzImage.img = hostileStore(t) })
	return append([]byte(nil), fuzzImage.img...)
}

// FuzzSuperblock replaces the superblock's checksummed bytes (0-75).
func FuzzSuperblock(f *testing.F) {
	good := fuzzTemplate(f)
	f.Add(good[:76])
	f.Fuzz(func(t *testing.T, data []byte) {
		img := fuzzTemplate(t)
		copy(img[:76], data)
		resum(img)
		openFuzzed(t, img, false)
	})
}

// FuzzSavedIndex replaces the saved index, whatever its length, at the
// place the clean close put it.
func FuzzSavedIndex(f *testing.F) {
	good := fuzzTemplate(f)
	le := binary.LittleEndian
	off := (superBlocks + le.Uint64(good[32:])) * blockSize
	f.Add(good[off : off+le.Uint64(good[40:])])
	f.Fuzz(func(t *testing.T, data []byte) {
		img := fuzzTemplate(t)
		data = data[:min(uint64(len(data)), uint64(len(img))-off)]
		copy(img[off:], data)
		le.PutUint64(img[40:], uint64(len(data)))
		le.PutUint32(img[48:], crc32.Checksum(data, castagnoli))
		resum(img)
		openFuzzed(t, img, true)
	})
}

// openFuzzed opens img and, if that works, uses the store. With
// validSuper, the superblock is sound and Open must succeed: a corrupt
// saved index costs the index, not the store.
func openFuzzed(t *testing.T, img []byte, validSuper bool) {
	path := writeImage(t, img)
	log := captureLog(t)
	var s *Store
	var err error
	if n := allocated(func() { s, err = Open(path, Options{}) }); n > maxOpenAlloc {
		t.Fatalf("open allocated %d bytes", n)
	}
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("open: error of several lines: %q", err)
		}
		if validSuper {
			t.Fatalf("open with a sound superblock: %v", err)
		}
		return
	}
	if n := strings.Count(log.String(), "\n"); n > 1 {
		t.Fatalf("open logged %d lines: %q", n, log.String())
	}
	for _, k := range []string{"a", "bb", "ccc"} {
		if got, err := s.Read(k); err == nil && string(got) != string(Generate(k, 700)) {
			t.Fatalf("read %s: wrong bytes", k)
		}
	}
	// Fill the store so that eviction and compaction run over whatever
	// was loaded; errors are allowed, panics are not.
	for i := 0; i < 40; i++ {
		k := string(rune('A' + i))
		if s.Create(k, Generate(k, 3000)) != nil {
			break
		}
	}
	s.Sync()
	st := s.Stats()
	if st.Used+st.Free != st.Capacity || st.Free < 0 {
		t.Fatalf("inconsistent stats after open: %+v", st)
	}
	s.Close()
}
