package net

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestStalledTruncation: an O_TRUNC open whose request a stalled link
// holds past the client's timeout is sent again on the next connection
// when the link heals within a timeout of the loss, and succeeds (it
// failed with EIO); the copy the stall held never lands after what the
// client does next (the 10-round soak's c3.12 f17: the stall, healed,
// delivered the old connection's open, which cut the file under an
// append the client had put at the old end: zeros before it). The server
// fences the old connection when the new opens the client's journal, so
// its copy lands before, or never (TestFence in export shows that part
// deterministically).
func TestStalledTruncation(t *testing.T) {
	const timeout = 3 * time.Second
	lower, _, addr, _ := spriteServer(t)
	relay := startFaultRelay(t, addr)
	if relay == nil {
		t.Fatal("shale delay has no --control")
	}
	m := mount(t, fmt.Sprintf("9p://%s/?timeout=%s&writedelay=1h", relay.addr, timeout))
	p := filepath.Join(m, "f")
	fresh, tail := []byte("fresh"), []byte("tail")
	writeFile(t, p, bytes.Repeat([]byte("o"), 793), 0o644)
	run(t, "sync", p)

	relay.command(t, "stall")
	opened := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err == nil {
			_, err = f.Write(fresh)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		opened <- err
	}()
	// Held past the timeout: the client gives the connection up.
	time.Sleep(timeout + 500*time.Millisecond)
	relay.command(t, "heal")
	if err := <-opened; err != nil {
		t.Fatalf("an O_TRUNC open across a stall healed within the timeout of the loss: %v", err)
	}
	if err := appendSync(t, p, tail); err != nil {
		t.Fatalf("fsync: %v", err)
	}

	want := append(slices.Clone(fresh), tail...)
	check := func(when string) {
		got, err := os.ReadFile(filepath.Join(lower, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s LOWER's f has %d bytes (%q...), want %q", when, len(got), got[:min(len(got), 16)], want)
		}
	}
	check("after the fsync,")
	// What the stall held has been delivered by now, or never will be.
	time.Sleep(time.Second)
	check("a second later,")
}
