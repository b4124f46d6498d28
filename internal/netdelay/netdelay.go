// Package netdelay is a TCP relay that adds a fixed latency, and
// optionally a bandwidth limit, to every connection through it: a stand-in
// for a network link on a machine whose kernel has no netem. It also counts
// the 9P requests clients send through it, so a benchmark can tell how many
// round trips a step cost. It can also fail the link on command (Reset,
// Partition, Stall: faults.go), for tests of what a client does when its
// network does.
package netdelay

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// chunkSize bounds one read, so that one chunk's share of the delay
	// and of the rate limit stays small.
	chunkSize = 32 << 10
	// queueLen chunks may be in flight per direction: with chunkSize, 32
	// MiB, so a 50 ms link still carries over 1 GB/s before the queue
	// pushes back on the sender (as a full TCP window would).
	queueLen = 1024
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// Proxy relays connections from its listener to a target.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration // one way: RTT/2
	rate   int64         // bytes per second per direction; 0: unlimited

	requests atomic.Uint64

	mu     sync.Mutex
	closed bool
	conns  map[*relay]struct{}
	wg     sync.WaitGroup

	// The link's fault (faults.go). fmu is taken before mu.
	fmu     sync.RWMutex
	mode    mode
	changed chan struct{} // closed and replaced when mode changes
}

// Listen starts a relay on listen (host:port) to target (host:port) that
// delays every byte by rtt/2 in each direction and, if rate > 0, lets at
// most rate bytes per second through in each direction of a connection.
func Listen(listen, target string, rtt time.Duration, rate int64) (*Proxy, error) {
	if rtt < 0 || rate < 0 {
		return nil, errors.New("netdelay: negative rtt or rate")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, delay: rtt / 2, rate: rate, conns: map[*relay]struct{}{}, changed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the relay listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Requests is the number of 9P messages clients have sent so far, over
// all connections; streams that are not 9P add nothing.
func (p *Proxy) Requests() uint64 { return p.requests.Load() }

// Close stops listening, ends every relayed connection and waits for the
// relay's goroutines to end.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true // no relay is added after this
	p.mu.Unlock()
	for _, r := range p.relays() {
		r.stop()
	}
	p.wg.Wait()
	return err
}

// relays is a snapshot of the connections being relayed.
func (p *Proxy) relays() []*relay {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := make([]*relay, 0, len(p.conns))
	for r := range p.conns {
		rs = append(rs, r)
	}
	return rs
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &relay{p: p, client: c, done: make(chan struct{}), ctx: ctx, cancel: cancel}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			cancel()
			c.Close()
			return
		}
		p.conns[r] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go r.run()
	}
}

// relay is one client connection and its connection to the target.
type relay struct {
	p        *Proxy
	client   net.Conn
	mu       sync.Mutex
	server   net.Conn // nil until dialed
	done     chan struct{}
	ctx      context.Context // the dial's, cancelled by stop
	cancel   context.CancelFunc
	stopOnce sync.Once

	lost    atomic.Bool // a partition dropped some of its bytes
	aborted atomic.Bool // ended by reset: closed with RSTs
	hanging bool        // in hang, woken by a deadline; under p.fmu
}

// stop ends the relay: both connections closed, every goroutine told.
func (r *relay) stop() {
	r.stopOnce.Do(func() {
		close(r.done)
		r.cancel()
		r.client.Close()
		r.mu.Lock()
		if r.server != nil {
			r.server.Close()
		}
		r.mu.Unlock()
	})
}

func (r *relay) run() {
	defer r.p.wg.Done()
	defer func() {
		r.stop()
		r.p.mu.Lock()
		delete(r.p.conns, r)
		r.p.mu.Unlock()
	}()
	fc := &frameCounter{n: &r.p.requests}
	if !r.hang(fc) {
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	s, err := d.DialContext(r.ctx, "tcp", r.p.target)
	if err != nil {
		return
	}
	r.mu.Lock()
	r.server = s
	r.mu.Unlock()
	if r.stopped() { // while dialing: stop saw no server to close
		if r.aborted.Load() {
			linger0(s)
		}
		s.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(4)
	up := make(chan chunk, queueLen)
	down := make(chan chunk, queueLen)
	go func() { defer wg.Done(); r.read(r.client, up, fc) }()
	go func() { defer wg.Done(); r.write(s, up) }()
	go func() { defer wg.Done(); r.read(s, down, nil) }()
	go func() { defer wg.Done(); r.write(r.client, down) }()
	wg.Wait()
}

func (r *relay) stopped() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// chunk is bytes read from one side, due at the other at due.
type chunk struct {
	buf *[]byte
	n   int
	due time.Time
}

// read moves what src sends onto q, each chunk stamped with the time it
// is due at the other end, so that chunks travel the link side by side
// as on a real one rather than each waiting out the one before it.
func (r *relay) read(src net.Conn, q chan<- chunk, fc *frameCounter) {
	defer close(q)
	tb := newBucket(r.p.rate)
	for {
		b := bufPool.Get().(*[]byte)
		n, err := src.Read((*b)[:tb.max(chunkSize)])
		if n > 0 && fc != nil {
			fc.feed((*b)[:n])
		}
		if n > 0 && !r.drop() {
			// The rate limit puts bytes on the link no faster than
			// rate; each then takes the delay to cross it.
			if !tb.take(n, r.done) {
				bufPool.Put(b)
				return
			}
			select {
			case q <- chunk{buf: b, n: n, due: time.Now().Add(r.p.delay)}:
			case <-r.done:
				bufPool.Put(b)
				return
			}
		} else {
			bufPool.Put(b)
		}
		if err != nil {
			// Across a partition the other end must not learn of
			// the error; Heal resets the connection instead.
			if !errors.Is(err, io.EOF) && !r.drop() {
				r.stop()
			}
			return
		}
	}
}

// write delivers the chunks on q to dst when each is due and the link
// lets it through; when q ends (src's EOF) it half-closes dst, so the EOF
// crosses the link too.
func (r *relay) write(dst net.Conn, q <-chan chunk) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for c := range q {
		if wait := time.Until(c.due); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-r.done:
				bufPool.Put(c.buf)
				return
			}
		}
		if !r.pass() {
			bufPool.Put(c.buf)
			if r.stopped() {
				return
			}
			continue
		}
		_, err := dst.Write((*c.buf)[:c.n])
		bufPool.Put(c.buf)
		if err != nil {
			r.stop()
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok && r.pass() {
		tc.CloseWrite()
	}
}

// bucket is a token bucket of rate bytes per second. Tokens may go
// negative (a chunk larger than what is left is sent, then paid for by
// waiting), which keeps the long-run rate exact with any chunk size.
type bucket struct {
	rate   int64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate int64) *bucket {
	if rate <= 0 {
		return &bucket{}
	}
	// 10 ms worth of bytes, at least 4 KiB: small enough that a short
	// measurement sees the rate, large enough for few wakeups.
	burst := max(float64(rate)/100, 4096)
	return &bucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

// max caps a read so that one chunk is never more than a burst.
func (b *bucket) max(n int) int {
	if b.rate == 0 || float64(n) <= b.burst {
		return n
	}
	return int(b.burst)
}

// take spends n tokens, waiting while the bucket is in debt; false if
// done closed while waiting.
func (b *bucket) take(n int, done <-chan struct{}) bool {
	if b.rate == 0 {
		return true
	}
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*float64(b.rate))
	b.last = now
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return true
	}
	t := time.NewTimer(time.Duration(-b.tokens / float64(b.rate) * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// 9P message bounds: a header is size[4] type[1] tag[2]; T-messages
// (client to server) have even types from 6 (Tlerror's slot) to 126
// (Twstat); no client negotiates an msize near maxFrame.
const (
	headerLen = 7
	maxFrame  = 64 << 20
	tversion  = 100
)

// frameCounter follows a client-to-server byte stream as 9P frames and
// counts them. At the first header that cannot be 9P (the stream is TLS,
// say) it gives up on the connection for good.
type frameCounter struct {
	n      *atomic.Uint64
	hdr    [5]byte // size[4] type[1]: all that is checked
	have   int     // bytes of hdr gathered
	skip   uint32  // bytes left of the current frame after hdr
	first  bool    // past the first frame
	broken bool
}

func (f *frameCounter) feed(b []byte) {
	for len(b) > 0 && !f.broken {
		if f.skip > 0 {
			k := min(uint32(len(b)), f.skip)
			f.skip -= k
			b = b[k:]
			continue
		}
		k := copy(f.hdr[f.have:], b)
		f.have += k
		b = b[k:]
		if f.have < len(f.hdr) {
			return
		}
		f.have = 0
		size := uint32(f.hdr[0]) | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])<<16 | uint32(f.hdr[3])<<24
		typ := f.hdr[4]
		// Every 9P session opens with Tversion: that, with sane sizes
		// and types after it, tells 9P from anything else.
		if size < headerLen || size > maxFrame || typ%2 != 0 || typ < 6 || typ > 126 || (!f.first && typ != tversion) {
			f.broken = true
			return
		}
		f.first = true
		f.n.Add(1)
		f.skip = size - uint32(len(f.hdr))
	}
}
