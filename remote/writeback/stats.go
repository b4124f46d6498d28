package writeback

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Counters are the write-behind's statistics (Sprite's tables).
type Counters struct {
	WriteServerBytes  atomic.Uint64 // written to the server: back or through
	Discarded, Lost   atomic.Uint64 // dirty bytes never sent: replaced, truncated, unlinked; or kept in conflict copies
	WriteBacks        [NReasons]atomic.Uint64
	Opens, OpensStale atomic.Uint64 // Tlopens answered; those that found another version
	OpensNoCache      atomic.Uint64 // answered NoCache: write-shared
	Recalls, Uncaches atomic.Uint64 // records received
	Cleans            atomic.Uint64 // Cleans sent of the client's own
	ReclaimsRefused   atomic.Uint64
	Helds             atomic.Uint64 // attributes of delayed data told the server (follow.go)
	Delegations       atomic.Uint64 // read delegations granted (deleg.go)
	OpensDelegated    atomic.Uint64 // opens a delegation answered, without a request
	Returns           atomic.Uint64 // delegations given back when the server asked
	TimesKept         atomic.Uint64 // settings of times kept with delayed writes (KeepTimes)
}

// DirtyBytes is how much delayed data the client holds.
func (w *Files) DirtyBytes() int64 { return w.dirtyBytes.Load() }

// DirtyFiles is how many files have delayed data.
func (w *Files) DirtyFiles() int { return len(w.dirtyFiles()) }

// SizeSample is the cache's size at one time.
type SizeSample struct {
	At         time.Time `json:"at"`
	CachedData int64     `json:"cached_bytes"`
	Dirty      int64     `json:"dirty_bytes"`
}

// sizes keeps the last hour of SizeSamples.
type sizes struct {
	mu   sync.Mutex
	last []SizeSample
}

const sizeEvery, sizeKeep = time.Minute, 60

// sample records the cache's size at now, at most once in sizeEvery.
func (w *Files) sample(now time.Time) {
	s := &w.sizes
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.last); n > 0 && now.Sub(s.last[n-1].At) < sizeEvery {
		return
	}
	_, cached := w.Cache.Size()
	s.last = append(s.last, SizeSample{At: now, CachedData: cached, Dirty: w.dirtyBytes.Load()})
	if len(s.last) > sizeKeep {
		s.last = s.last[len(s.last)-sizeKeep:]
	}
}

// Sizes is the cache's size over time: a sample a minute, the last hour
// (Sprite's Table 2 followed it over days), now's included.
func (w *Files) Sizes() []SizeSample {
	w.sample(time.Now())
	w.sizes.mu.Lock()
	defer w.sizes.mu.Unlock()
	return slices.Clone(w.sizes.last)
}
