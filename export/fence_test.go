package export

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFence: a client that opens its journal on a new connection has
// given the old one up; a request it sent there that the server had not
// read yet (a stalled link held it) is never served, so it cannot land
// after what the client does next: here an O_TRUNC open, which would cut
// the file the client goes on writing through the new connection.
func TestFence(t *testing.T) {
	f := newFixture(t, Options{Sprite: true})
	p := filepath.Join(f.dir, "f")
	if err := os.WriteFile(p, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := f.jdial(t, testUUID, true)
	old.must(t, "walk", twalk(4, 0, 1, "f"))

	fresh := f.jdial(t, testUUID, false) // the reconnection
	old.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := old.c.Write(frame(tLopen, 5, uint32(1), uint32(syscall.O_WRONLY|syscall.O_TRUNC))); err == nil {
		if typ, _, err := old.recv(); err == nil {
			t.Errorf("the old connection served a request after its client opened the journal on another (reply type %d)", typ)
		}
	}
	if b, _ := os.ReadFile(p); string(b) != "kept" {
		t.Fatalf("f holds %q after the old connection's O_TRUNC, want %q", b, "kept")
	}
	fresh.must(t, "walk on the new connection", twalk(6, 0, 1, "f"))
	if n := f.s.fences.Load(); n != 1 {
		t.Errorf("%d connections fenced, want 1", n)
	}
}
