package p9net

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shalefs/shale/internal/shaletest"
)

// A full Pending set closes the oldest of the peer with the most.
func TestPendingEvicts(t *testing.T) {
	p := NewPending(3)
	var closed []string
	add := func(peer, name string) func() {
		return p.Add(peer, func() { closed = append(closed, name) })
	}
	add("a", "a1")
	add("b", "b1")
	add("b", "b2")
	add("c", "c1") // b has the most: its oldest goes
	done := add("c", "c2")
	done()
	done() // idempotent
	add("d", "d1")
	want := []string{"b1", "a1"} // then a, b, c tie at one each: the oldest, a1
	if len(closed) != len(want) || closed[0] != want[0] || closed[1] != want[1] {
		t.Errorf("closed %q, want %q", closed, want)
	}
	if p.Len() != 3 {
		t.Errorf("Len %d, want 3", p.Len())
	}
}

// raiseNoFile lets the test process hold n descriptors.
func raiseNoFile(t *testing.T, n uint64) {
	if got, err := shaletest.RaiseNoFile(n); err != nil || got < n {
		t.Skipf("cannot hold %d descriptors (limit %d): %v", n, got, err)
	}
}

// 1,000 connections that never start TLS leave a client with the key
// able to connect at once: the oldest make room. Before, 128 of them took
// every handshake slot for 10 s and the client was turned away ("the
// server holds another key").
func TestHandshakeFlood(t *testing.T) {
	raiseNoFile(t, 4096)
	a, key, l := listenKeyed(t, ListenConfig{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for range 1000 {
		c, err := net.Dial("unix", a.Address)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	good, err := Dial(ctx, a, key)
	if err != nil {
		t.Fatalf("with 1,000 silent connections: %v", err)
	}
	good.Close()
	t.Logf("authenticated in %v with 1,000 silent connections", time.Since(start))
}

// A connection that does not authenticate within the timeout is closed.
func TestHandshakeDeadline(t *testing.T) {
	a, _, _ := listenKeyed(t, ListenConfig{HandshakeTimeout: 200 * time.Millisecond})
	c, err := net.Dial("unix", a.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silent connection was not closed: %v", err)
	}
}

// listenKeyed listens as lc says with a key on a new unix socket, until
// the test ends.
func listenKeyed(t *testing.T, lc ListenConfig) (Addr, Key, net.Listener) {
	lc.Key = Key("0123456789abcdef0123")
	a := Addr{"unix", filepath.Join(t.TempDir(), "s.sock")}
	l, err := lc.Listen(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return a, lc.Key, l
}
