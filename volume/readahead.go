package volume

import (
	"context"
	"sync"
	"sync/atomic"
)

// Read-ahead: a handle read in order has the blocks after the one it
// reads fetched in the background into the block cache, so that S3's
// latency overlaps the reading instead of adding to it block by block.
// Random readers get none. A fetch, read-ahead's or a read's, is made at
// most once at a time per block: who asks for a block being fetched
// waits for that fetch.

const (
	// readAhead is how many blocks past the one read are fetched: with
	// 4 MiB blocks, 16 MiB ahead, several S3 round trips' worth at the
	// rates a loopback or LAN store gives, and little memory.
	readAhead = 4
	// aheadMax bounds the read-ahead fetches in flight over all handles,
	// so many sequential readers together hold at most this many blocks
	// in the making (32 MiB at 4 MiB a block).
	aheadMax = 8
)

// fetches is the blockStore's fetches in flight and its read-ahead.
// Its lock is taken alone.
type fetches struct {
	mu      sync.Mutex
	flights map[string]*fetching

	slots  chan struct{} // a read-ahead fetch holds one
	ctx    context.Context
	cancel context.CancelFunc // at close: ends read-ahead's fetches
	wg     sync.WaitGroup

	gets  atomic.Int64 // blocks fetched from S3 (a retried GET counts once)
	ahead atomic.Int64 // of which for read-ahead
}

type fetching struct {
	done chan struct{}
	b    []byte
	err  error
}

func (x *fetches) init() {
	x.flights = map[string]*fetching{}
	x.slots = make(chan struct{}, aheadMax)
	x.ctx, x.cancel = context.WithCancel(context.Background())
}

// stop ends read-ahead and waits for its fetches: nothing is cached
// after the caches close.
func (x *fetches) stop() {
	x.cancel()
	x.wg.Wait()
}

// once loads id, unless a load of it is in flight: then it waits for
// that one, and loads anew only if that one failed.
func (s *blockStore) once(ctx context.Context, id string, want int) ([]byte, error) {
	f, mine := s.fetches.begin(id)
	if mine {
		b, ok := s.cache.get(id) // one may have ended since get looked
		if ok && len(b) >= want {
			s.fetches.end(id, f, b, nil)
			return b, nil
		}
		b, err := s.load(ctx, id, want)
		s.fetches.end(id, f, b, err)
		return b, err
	}
	select {
	case <-f.done:
		if f.err == nil && len(f.b) >= want {
			return f.b, nil
		}
		return s.load(ctx, id, want) // a read-ahead's error is not the read's
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// begin records a load of id, or gives the one in flight.
func (x *fetches) begin(id string) (f *fetching, mine bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if f, ok := x.flights[id]; ok {
		return f, false
	}
	f = &fetching{done: make(chan struct{})}
	x.flights[id] = f
	return f, true
}

// end gives a load's result to those waiting for it.
func (x *fetches) end(id string, f *fetching, b []byte, err error) {
	x.mu.Lock()
	delete(x.flights, id)
	x.mu.Unlock()
	f.b, f.err = b, err
	close(f.done)
}

// readAheadOf loads in the background those of blocks not cached or in
// flight, as many as a slot is free for; it never waits. The load is
// recorded before this returns, so the next read neither repeats it nor
// loads the block itself alongside.
func (s *blockStore) readAheadOf(blocks []Block) {
	x := &s.fetches
	for _, b := range blocks {
		if b.ID == "" || s.cache.has(b.ID) {
			continue
		}
		select {
		case x.slots <- struct{}{}:
		default:
			return
		}
		f, mine := x.begin(b.ID)
		if !mine {
			<-x.slots
			continue
		}
		x.wg.Add(1)
		x.ahead.Add(1)
		go func() {
			defer x.wg.Done()
			data, err := s.load(x.ctx, b.ID, int(b.Len)) // an error: the read loads again
			x.end(b.ID, f, data, err)
			<-x.slots
		}()
	}
}

// seqReads tells a handle's reads in order from random ones.
type seqReads struct {
	mu   sync.Mutex
	next int64 // where the last read ended; 0: none yet
}

// sequential records a read of [off, end) and tells whether it follows
// the last: starts where that ended or within the block it ended in.
func (q *seqReads) sequential(off, end, bs int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	last := q.next
	q.next = end
	return last > 0 && (off == last || off >= 0 && off/bs == (last-1)/bs)
}

// readAhead starts fetching the readAhead blocks after the one a read
// ended in, those stored and not changed here.
func (f *fileState) readAhead(end int64) {
	bs := f.bs()
	n := min(readAhead, f.fs.blocks.cache.max/bs/2) // never crowd out what is read
	var todo []Block
	f.mu.Lock()
	for i := (end-1)/bs + 1; i <= (end-1)/bs+n && i*bs < int64(f.size); i++ {
		if _, ok := f.dirty[i]; !ok {
			todo = append(todo, f.baseBlock(i))
		}
	}
	f.mu.Unlock()
	f.fs.blocks.readAheadOf(todo)
}
