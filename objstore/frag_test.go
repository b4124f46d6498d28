package objstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestFragmentation holds a store at 95% full while replacing small objects
// with larger ones, so free space ends up in holes too short for new
// objects. Every create must still succeed, without evicting anything:
// compaction gathers the holes.
func TestFragmentation(t *testing.T) {
	s, _ := newTestStore(t, 16<<20, "")
	defer s.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	live := map[string]int{} // key -> size
	var keys []string
	next := 0
	create := func(size int) {
		key := fmt.Sprintf("o%d", next)
		next++
		if err := s.Create(key, Generate(key, size)); err != nil {
			t.Fatalf("create %s (%d bytes) at %.1f%% full: %v", key, size, 100*float64(s.Stats().Used)/float64(s.Stats().Capacity), err)
		}
		live[key] = size
		keys = append(keys, key)
	}
	full := func(extra int) bool {
		st := s.Stats()
		return float64(st.Used+int64(extra)+2*blockSize) > 0.95*float64(st.Capacity)
	}
	for !full(8 << 10) {
		create(1 + rng.IntN(8<<10))
	}
	for round := 0; round < 400; round++ {
		size := 16<<10 + rng.IntN(48<<10)
		for full(size) {
			i := rng.IntN(len(keys))
			key := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			if err := s.Remove(key); err != nil {
				t.Fatal(err)
			}
			delete(live, key)
		}
		create(size)
	}
	st := s.Stats()
	t.Logf("%d objects, %.1f%% used, %d compactions moved %d KiB, fragmentation %.2f", st.Objects, 100*float64(st.Used)/float64(st.Capacity), st.Compactions, st.MovedBytes>>10, st.Fragmentation)
	if st.Evictions != 0 {
		t.Errorf("%d evictions: compaction should have made room", st.Evictions)
	}
	if st.Compactions == 0 {
		t.Errorf("no compactions: the test did not fragment free space")
	}
	if st.Objects != len(live) {
		t.Errorf("store has %d objects, want %d", st.Objects, len(live))
	}
	for key, size := range live {
		got, err := s.Read(key)
		if err != nil || !bytes.Equal(got, Generate(key, size)) {
			t.Fatalf("%s after compaction: err %v, equal %v", key, err, bytes.Equal(got, Generate(key, size)))
		}
	}
}
