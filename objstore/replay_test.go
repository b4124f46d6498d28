package objstore

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// The repository is checked out with shared/ beside it.
const webTrace = "../../shared/traces/web-objects.trace.xz"

// TestReplayTrace replays the web trace into a store a quarter of its size,
// so that eviction and compaction run on real object sizes; Replay checks
// every hit's bytes. Both policies run, and SIEVE should not lose to LRU.
func TestReplayTrace(t *testing.T) {
	if _, err := os.Stat(webTrace); err != nil {
		t.Skipf("trace not found at %s (clone shared/ beside the repository): %v", webTrace, err)
	}
	ratio := map[string]float64{}
	for _, policy := range []string{"sieve", "lru"} {
		s, _ := newTestStore(t, 64<<20, policy)
		f, err := os.Open(webTrace)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTraceReader(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Replay(s, tr, nil)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		st := s.Stats()
		t.Logf("%s: %d requests, hit ratio %.3f, %.0f ops/s, %d evictions, %d compactions", policy, res.Requests, res.HitRatio(), res.OpsPerSec(), st.Evictions, st.Compactions)
		ratio[policy] = res.HitRatio()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if ratio["sieve"] < ratio["lru"]-0.01 {
		t.Errorf("SIEVE hit ratio %.3f below LRU's %.3f", ratio["sieve"], ratio["lru"])
	}
}

// TestTraceErrors checks that a bad trace line is reported with its number.
func TestTraceErrors(t *testing.T) {
	for _, bad := range []string{"1 a 10\n2 b\n", "1 a 10\n2 b -3\n", "1 a 10\n2 b ten\n"} {
		tr, err := NewTraceReader(strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		tr.Next()
		if _, err := tr.Next(); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: error %v, want one naming line 2", bad, err)
		}
	}
}

// TestReplayHugeSize replays traces whose sizes the store cannot hold: the
// error is one line naming the trace line, and nothing that size is
// allocated.
func TestReplayHugeSize(t *testing.T) {
	s, _ := newTestStore(t, 1<<20, "")
	defer s.Close()
	for _, size := range []string{"1000000000000", "9223372036854775807", "2097152", "1048576"} {
		tr, err := NewTraceReader(strings.NewReader("1 a 10\n\n2 b " + size + "\n3 c 10\n"))
		if err != nil {
			t.Fatal(err)
		}
		var res ReplayResult
		n := allocated(func() { res, err = Replay(s, tr, nil) })
		if err == nil || !strings.Contains(err.Error(), "trace line 3:") || strings.Contains(err.Error(), "\n") ||
			!errors.Is(err, ErrTooLarge) {
			t.Errorf("size %s: error %v, want one line naming trace line 3", size, err)
		}
		if res.Requests != 1 {
			t.Errorf("size %s: %d requests replayed, want 1", size, res.Requests)
		}
		if n > 1<<20 {
			t.Errorf("size %s: replay allocated %d bytes", size, n)
		}
	}
	// The largest object the store holds replays.
	big := s.Stats().Capacity - pageSize
	tr, _ := NewTraceReader(strings.NewReader(fmt.Sprintf("1 big %d\n1 big %d\n", big, big)))
	if res, err := Replay(s, tr, nil); err != nil || res.Hits != 1 {
		t.Errorf("replay of a %d-byte object: %+v, %v", big, res, err)
	}
}
