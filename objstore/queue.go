package objstore

import "sync"

// queueLimit bounds the bytes waiting in the write queue, so a fast producer
// waits instead of pinning unbounded memory.
const queueLimit = 64 << 20

// request is one object write: its bytes as buffers laid end to end.
type request struct {
	off    int64
	bufs   [][]byte
	n      int
	direct bool   // the aligned layout, written by O_DIRECT on its own
	block  uint32 // first block, the key of the pending map
	key    string
	data   []byte
	sess   *Session
}

// queue is the asynchronous request queue of the paper: callers submit
// writes and go on, and one disk goroutine performs them in order. Order
// matters: blocks freed and reused are written by the later request last.
// The goroutine takes everything queued at once and merges writes to
// adjacent blocks into a single pwritev, so a run of small creates costs
// one system call.
type queue struct {
	dev     *device
	mu      sync.Mutex
	cond    sync.Cond
	items   []*request
	bytes   int
	busy    bool
	closed  bool
	pending map[uint32]*request // queued or in-flight writes by first block
	peak    int                 // the most entries pending held since it was last made
	done    chan struct{}
}

func newQueue(dev *device) *queue {
	q := &queue{dev: dev, pending: map[uint32]*request{}, done: make(chan struct{})}
	q.cond.L = &q.mu
	go q.run()
	return q
}

// waitRoom blocks while the queue is over its byte limit.
func (q *queue) waitRoom() {
	q.mu.Lock()
	for q.bytes > queueLimit {
		q.cond.Wait()
	}
	q.mu.Unlock()
}

func (q *queue) push(r *request) {
	q.mu.Lock()
	q.items = append(q.items, r)
	q.bytes += r.n
	q.pending[r.block] = r
	q.peak = max(q.peak, len(q.pending))
	q.cond.Broadcast()
	q.mu.Unlock()
}

// pendingData returns a copy of key's data if its write starting at block
// has not completed yet; until then the disk holds something else.
func (q *queue) pendingData(block uint32, key string) ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.pending[block]
	if r == nil || r.key != key {
		return nil, false
	}
	return append([]byte(nil), r.data...), true
}

// drain waits until every queued write has reached the device.
func (q *queue) drain() {
	q.mu.Lock()
	for len(q.items) > 0 || q.busy {
		q.cond.Wait()
	}
	q.mu.Unlock()
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
	<-q.done
}

func (q *queue) run() {
	defer close(q.done)
	for {
		q.mu.Lock()
		for len(q.items) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.items) == 0 {
			q.mu.Unlock()
			return
		}
		batch := q.items
		q.items = nil
		q.busy = true
		q.mu.Unlock()

		errs := q.write(batch)

		q.mu.Lock()
		for _, r := range batch {
			q.bytes -= r.n
			if q.pending[r.block] == r {
				delete(q.pending, r.block)
			}
		}
		if len(q.pending) == 0 && q.peak > 1024 {
			// Go maps never shrink: a burst of small creates would
			// otherwise leave its buckets behind for good.
			q.pending, q.peak = map[uint32]*request{}, 0
		}
		q.busy = false
		q.cond.Broadcast()
		q.mu.Unlock()
		for i, r := range batch {
			r.sess.done(errs[i])
		}
	}
}

// write performs a batch in order, merging runs of adjacent buffered writes.
func (q *queue) write(batch []*request) []error {
	errs := make([]error, len(batch))
	for i := 0; i < len(batch); {
		j, end := i+1, batch[i].off+int64(batch[i].n)
		var bufs [][]byte
		bufs = append(bufs, batch[i].bufs...)
		for ; j < len(batch) && !batch[i].direct && !batch[j].direct && batch[j].off == end; j++ {
			bufs = append(bufs, batch[j].bufs...)
			end += int64(batch[j].n)
		}
		err := q.dev.writev(bufs, batch[i].off)
		for k := i; k < j; k++ {
			errs[k] = err
		}
		i = j
	}
	return errs
}

// A Session is one caller of the queue. Its creates return once the object
// is indexed and its write queued; Sync waits for that caller's writes only,
// as the paper's sync() does per thread.
type Session struct {
	st          *Store
	mu          sync.Mutex
	cond        sync.Cond
	outstanding int
	err         error
}

func newSession(st *Store) *Session {
	c := &Session{st: st}
	c.cond.L = &c.mu
	return c
}

func (c *Session) add() {
	c.mu.Lock()
	c.outstanding++
	c.mu.Unlock()
}

func (c *Session) done(err error) {
	c.mu.Lock()
	c.outstanding--
	if err != nil && c.err == nil {
		c.err = err
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Sync waits until every write this session submitted has reached the
// device (not necessarily stable storage: cached objects have a copy
// elsewhere) and returns the first write error since the last Sync. An
// object whose write failed reads as a miss, never as wrong bytes.
func (c *Session) Sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.outstanding > 0 {
		c.cond.Wait()
	}
	err := c.err
	c.err = nil
	return err
}
