package objstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

func newTestStore(t *testing.T, size int64, policy string) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	s, err := Format(path, size, Options{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

// TestModel runs random creates, reads, removes and reopens against a map.
// The store is small, so it also evicts: a read may miss where the model
// has the key (the key must then be gone for good), but a read that returns
// data must return exactly the model's bytes, and a removed key must miss.
func TestModel(t *testing.T) {
	for _, policy := range []string{"sieve", "lru"} {
		t.Run(policy, func(t *testing.T) {
			s, path := newTestStore(t, 4<<20, policy)
			rng := rand.New(rand.NewPCG(1, 2))
			fill := rand.NewChaCha8([32]byte{1})
			model := map[string][]byte{}
			var creates, evicted int
			var evictions uint64
			for op := 0; op < 20000; op++ {
				key := fmt.Sprintf("k%d", rng.IntN(600))
				switch r := rng.IntN(100); {
				case r < 45:
					size := rng.IntN(16 << 10)
					if rng.IntN(50) == 0 {
						size = directMin + rng.IntN(300<<10) // the aligned layout
					}
					data := make([]byte, size)
					fill.Read(data)
					if err := s.Create(key, data); err != nil {
						t.Fatalf("op %d: create %s: %v", op, key, err)
					}
					model[key] = data
					creates++
				case r < 85:
					got, err := s.Read(key)
					if rng.IntN(2) == 0 {
						buf := make([]byte, 600<<10)
						var n int
						n, err = s.ReadInto(key, buf)
						got = buf[:n]
					}
					want, inModel := model[key]
					switch {
					case err == nil && !inModel:
						t.Fatalf("op %d: read %s: got %d bytes of a key never created or removed", op, key, len(got))
					case err == nil && !bytes.Equal(got, want):
						t.Fatalf("op %d: read %s: wrong bytes", op, key)
					case errors.Is(err, ErrNotFound) && inModel:
						delete(model, key) // evicted
						evicted++
					case err != nil && !errors.Is(err, ErrNotFound):
						t.Fatalf("op %d: read %s: %v", op, key, err)
					}
					if n, err := s.Length(key); err == nil && n != len(want) {
						t.Fatalf("op %d: length %s = %d, want %d", op, key, n, len(want))
					}
				case r < 99 || rng.IntN(8) != 0:
					err := s.Remove(key)
					if _, inModel := model[key]; inModel && err != nil {
						// Only eviction may have taken it already.
						if !errors.Is(err, ErrNotFound) {
							t.Fatalf("op %d: remove %s: %v", op, key, err)
						}
					}
					delete(model, key)
				default:
					evictions += s.Stats().Evictions
					if err := s.Close(); err != nil {
						t.Fatalf("op %d: close: %v", op, err)
					}
					var err error
					if s, err = Open(path, Options{Policy: policy}); err != nil {
						t.Fatalf("op %d: reopen: %v", op, err)
					}
					if !s.Stats().CleanOpen {
						t.Fatalf("op %d: reopen after clean close lost the index", op)
					}
				}
			}
			st := s.Stats()
			if evictions+st.Evictions == 0 {
				t.Errorf("no evictions: the test did not fill the store")
			}
			t.Logf("%d creates, %d keys lost to eviction, stats %+v", creates, evicted, st)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
