package export

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// sharedWithFollower makes f write-shared between two plain clients and
// adds a follower, a client with a journal that looked f up and then
// never reads its journal; it returns the writer, with f open on fid 1.
func sharedWithFollower(t *testing.T, fx *fixture) *raw {
	t.Helper()
	os.WriteFile(filepath.Join(fx.dir, "f"), []byte("x"), 0o644)
	a := fx.other(t)
	a.must(t, "walk", twalk(1, 0, 1, "f"))
	a.must(t, "open", frame(tLopen, 1, uint32(1), uint32(syscall.O_RDWR)))
	b := fx.other(t)
	b.must(t, "walk", twalk(1, 0, 1, "f"))
	b.must(t, "open", frame(tLopen, 1, uint32(1), uint32(syscall.O_RDONLY))) // write-shared now
	c := fx.jdial(t, "2f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", true)
	c.walkTo(t, 1, "f")
	return a
}

// A write of a write-shared file waits for the clients that cache it,
// but one that lets that wait time out is not waited for again until it
// caught up: a stalled follower costs one recall timeout, not one a write.
func TestStalledFollowerWaitedOnce(t *testing.T) {
	const timeout = 3 * time.Second
	fx := newFixture(t, Options{NoRootSquash: true, Sprite: true, RecallTimeout: timeout})
	a := sharedWithFollower(t, fx)
	start := time.Now()
	a.must(t, "write", frame(tWrite, 5, uint32(1), uint64(0), uint32(1), []byte("y")))
	if d := time.Since(start); d < timeout {
		t.Fatalf("the first write returned in %v: the follower's journal was not waited for", d)
	}
	start = time.Now()
	for range 5 {
		a.must(t, "write", frame(tWrite, 5, uint32(1), uint64(0), uint32(1), []byte("z")))
	}
	if d := time.Since(start); d >= timeout {
		t.Fatalf("5 more writes took %v: the stalled follower was waited for again", d)
	}
}

// Requests that wait on another party out of their slots are bounded:
// large ones (a Twrite of 60 KB) keep their slots, so a client whose
// writes all wait has no more than the slots' worth in flight.
func TestWaitingRequestsBounded(t *testing.T) {
	fx := newFixture(t, Options{NoRootSquash: true, Sprite: true, RecallTimeout: time.Minute})
	a := sharedWithFollower(t, fx)
	data := make([]byte, 60000)
	const n = 400
	var m []byte
	for i := range n {
		m = append(m, frame(tWrite, uint16(10+i), uint32(1), uint64(0), uint32(len(data)), data)...)
	}
	go a.c.Write(m)
	peak := int32(0)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		fx.s.mu.Lock()
		for c := range fx.s.conns {
			peak = max(peak, c.inflight.Load())
		}
		fx.s.mu.Unlock()
	}
	if peak > maxInFlight {
		t.Fatalf("%d requests in flight on one connection, all waiting: want at most %d", peak, maxInFlight)
	}
	if peak < maxInFlight/2 {
		t.Fatalf("only %d requests in flight: the writes did not wait, the test shows nothing", peak)
	}
	a.c.Close()
}
