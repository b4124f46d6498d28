package netdelay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Times are checked only from below: the machine is shared and noisy, so
// anything may take longer than it should, never shorter.

// server serves every connection on a loopback port with handle, until
// the test ends.
func server(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); handle(c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// echoServer echoes every connection until closed.
func echoServer(t *testing.T) string {
	return server(t, func(c net.Conn) { io.Copy(c, c) })
}

// sinkServer reads and discards every connection, reporting the bytes of
// each on the channel when it ends.
func sinkServer(t *testing.T) (string, <-chan int64) {
	got := make(chan int64, 16)
	return server(t, func(c net.Conn) { n, _ := io.Copy(io.Discard, c); got <- n }), got
}

func listen(t *testing.T, target string, rtt time.Duration, rate int64) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", target, rtt, rate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRTT(t *testing.T) {
	const rtt = 40 * time.Millisecond
	p := listen(t, echoServer(t), rtt, 0)
	c := dial(t, p.Addr())
	buf := make([]byte, 1)
	for i := range 5 {
		t0 := time.Now()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d < rtt {
			t.Errorf("ping %d: round trip %v, less than the RTT %v", i, d, rtt)
		}
		if buf[0] != byte(i) {
			t.Fatalf("ping %d: echoed %d", i, buf[0])
		}
	}
}

// TestPipelined sends many small pings without waiting for replies: on a
// link they all arrive about one RTT later, not one RTT after another.
// That is an upper bound, which this machine cannot be held to: the time
// is logged, against the serial relay's, for a reader to judge.
func TestPipelined(t *testing.T) {
	const rtt = 50 * time.Millisecond
	const pings = 20
	p := listen(t, echoServer(t), rtt, 0)
	c := dial(t, p.Addr())
	t0 := time.Now()
	go func() {
		for i := range pings {
			c.Write([]byte{byte(i)})
			time.Sleep(time.Millisecond)
		}
	}()
	buf := make([]byte, pings)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	d := time.Since(t0)
	if d < rtt {
		t.Errorf("%d pings came back in %v, less than the RTT %v", pings, d, rtt)
	}
	t.Logf("%d pipelined pings took %v (a serial relay: at least %v)", pings, d, pings*rtt)
	for i, b := range buf {
		if b != byte(i) {
			t.Fatalf("byte %d is %d: reordered", i, b)
		}
	}
}

func TestData(t *testing.T) {
	p := listen(t, echoServer(t), 2*time.Millisecond, 0)
	c := dial(t, p.Addr())
	want := make([]byte, 3<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() { c.Write(want); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, not the %d sent", len(got), len(want))
	}
}

func TestRate(t *testing.T) {
	const rate = 2 << 20 // bytes/s
	const total = 3 << 20
	addr, got := sinkServer(t)
	p := listen(t, addr, 0, rate)
	c := dial(t, p.Addr())
	t0 := time.Now()
	if _, err := c.Write(make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	n := <-got
	d := time.Since(t0)
	if n != total {
		t.Fatalf("server got %d bytes, sent %d", n, total)
	}
	// The bucket starts full: one burst may go at once.
	burst := float64(rate) / 100
	if r := float64(n-int64(burst)) / d.Seconds(); r > rate*1.1 {
		t.Errorf("%d bytes in %v: %.0f B/s, over the limit %d B/s", n, d, r, rate)
	}
}

// frame is a 9P message of type typ with body bytes after its header.
func frame(typ byte, tag uint16, body int) []byte {
	b := make([]byte, 7+body)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	b[4] = typ
	binary.LittleEndian.PutUint16(b[5:], tag)
	return b
}

// waitRequests waits for the relay to count want requests; it counts as
// it reads, so a sink may have everything before the count is done.
func waitRequests(t *testing.T, p *Proxy, want uint64) {
	t.Helper()
	for range 200 {
		if p.Requests() == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("counted %d requests, want %d", p.Requests(), want)
}

func TestCount9P(t *testing.T) {
	addr, got := sinkServer(t)
	p := listen(t, addr, 0, 0)
	var stream []byte
	stream = append(stream, frame(tversion, 0xffff, 13)...)
	for i := range 100 {
		stream = append(stream, frame(110, uint16(i), i*37)...) // Twalk
	}
	stream = append(stream, frame(118, 1, 200000)...) // Twrite, larger than a chunk
	const want = 102
	c := dial(t, p.Addr())
	// Written a few bytes at a time, so headers straddle reads.
	for len(stream) > 0 {
		k := min(len(stream), 3+len(stream)%5000)
		if _, err := c.Write(stream[:k]); err != nil {
			t.Fatal(err)
		}
		stream = stream[k:]
	}
	c.Close()
	<-got
	waitRequests(t, p, want)

	// A second connection adds to the count.
	c = dial(t, p.Addr())
	c.Write(append(frame(tversion, 0xffff, 13), frame(120, 2, 4)...))
	c.Close()
	<-got
	waitRequests(t, p, want+2)
}

func TestCountNot9P(t *testing.T) {
	addr, got := sinkServer(t)
	p := listen(t, addr, 0, 0)
	// The start of a TLS ClientHello, then bytes that would parse as a
	// 9P frame if the counter had not given up.
	hello := []byte{0x16, 0x03, 0x01, 0x00, 0xf4, 0x01, 0x00, 0x00, 0xf0, 0x03, 0x03}
	c := dial(t, p.Addr())
	c.Write(append(hello, frame(tversion, 0, 0)...))
	c.Close()
	<-got
	// A frame whose size is absurd stops counting too.
	c = dial(t, p.Addr())
	bad := frame(tversion, 0, 0)
	binary.LittleEndian.PutUint32(bad, 0xffffff00)
	c.Write(append(frame(tversion, 0, 5), append(bad, frame(110, 1, 0)...)...))
	c.Close()
	<-got
	waitRequests(t, p, 1)
}

func TestCloseNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		echo, stopEcho := echoServerManual(t)
		defer stopEcho()
		p, err := Listen("127.0.0.1:0", echo, 20*time.Millisecond, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var cs []net.Conn
		for range 5 {
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			c.Write(make([]byte, 100000)) // in flight when Close comes
			cs = append(cs, c)
		}
		// A connection to a target that is not there.
		p2, err := Listen("127.0.0.1:0", "127.0.0.1:1", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		c2, _ := net.Dial("tcp", p2.Addr())
		time.Sleep(50 * time.Millisecond)
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		p2.Close()
		for _, c := range cs {
			// The relay closed its side: reads end, with EOF or (the
			// relay had unread bytes) a reset, not by the deadline.
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("client read after Close: %v", err)
			}
			c.Close()
		}
		if c2 != nil {
			c2.Close()
		}
	}()
	settled(t, before, 2*time.Second)
}

// settled waits up to limit for the goroutines to be back to before, and
// fails t with their stacks if they are not.
func settled(t *testing.T, before int, limit time.Duration) {
	t.Helper()
	var n int
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= before {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
}

// echoServerManual is echoServer, stopped by the caller rather than at
// the test's end, so that goroutines can be counted after it.
func echoServerManual(t *testing.T) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String(), func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}
