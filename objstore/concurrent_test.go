package objstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestConcurrent runs creators, readers and removers at once on a small
// store, so that eviction and compaction run under them. Each key has one
// possible content, so every successful read can be checked.
func TestConcurrent(t *testing.T) {
	s, _ := newTestStore(t, 8<<20, "")
	defer s.Close()
	object := func(key string) []byte { return Generate(key, int(keyHash(key)%(24<<10))) }
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			sess := s.NewSession()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for op := 0; op < 3000; op++ {
				key := fmt.Sprintf("c%d", rng.IntN(1500))
				switch r := rng.IntN(10); {
				case r < 4:
					if err := sess.Create(key, object(key)); err != nil {
						errc <- err
						return
					}
				case r < 9:
					got, err := s.Read(key)
					if err == nil && !bytes.Equal(got, object(key)) {
						errc <- fmt.Errorf("%s: wrong bytes", key)
						return
					}
					if err != nil && !errors.Is(err, ErrNotFound) {
						errc <- err
						return
					}
				default:
					s.Remove(key)
				}
			}
			if err := sess.Sync(); err != nil {
				errc <- err
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("%+v", st)
}

// TestCorruption checks that damaged bytes read as a miss, that a damaged
// saved index is dropped, and that a damaged superblock makes Open fail
// with ErrCorrupt.
func TestCorruption(t *testing.T) {
	s, path := newTestStore(t, 1<<20, "")
	data := Generate("victim", 3000)
	if err := s.Create("victim", data); err != nil {
		t.Fatal(err)
	}
	s.Sync()
	s.mu.Lock()
	id, _, _ := s.idx.find(keyHash("victim"))
	off := int64(superBlocks+s.idx.at(id).block)*blockSize + 1000
	s.mu.Unlock()
	if _, err := s.dev.f.WriteAt([]byte{0xff}, off); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read("victim"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of damaged object: %v, want ErrNotFound", err)
	}
	if _, err := s.Length("victim"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("damaged object still indexed")
	}
	s.Create("kept", data)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read("kept"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after clean reopen: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Damage the saved index: Open must not trust it, but drop it and
	// serve, as after a crash (hostile_test.go checks this in detail).
	sb := readSuperForTest(t, path)
	damage(t, path, int64(superBlocks+sb.indexBlock)*blockSize+3)
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("open with damaged index: %v, want the index dropped", err)
	}
	if _, err := s.Read("kept"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read with the damaged index dropped: %v, want a miss", err)
	}
	s.Close()
	damage(t, path, 20)
	if _, err := Open(path, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with damaged superblock: %v, want ErrCorrupt", err)
	}
}

func readSuperForTest(t *testing.T, path string) superblock {
	dev, err := openDevice(path, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.close()
	sb, err := readSuper(dev, make([]byte, superBlocks*blockSize))
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func damage(t *testing.T, path string, off int64) {
	dev, err := openDevice(path, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.close()
	b := make([]byte, 1)
	dev.f.ReadAt(b, off)
	b[0] ^= 0x55
	if _, err := dev.f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
