package fuseview

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shalefs/shale/layer"
)

// slowLookup holds up the lookups of one name until gate closes.
type slowLookup struct {
	layer.Node
	name    string
	entered chan struct{}
	gate    chan struct{}
}

func (s *slowLookup) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if name == s.name {
		close(s.entered)
		<-s.gate
	}
	return s.Node.Lookup(ctx, name, out)
}

// go-fuse may call OnForget for an inode that a LOOKUP at work at that
// moment gives back to the kernel: the LOOKUP found the inode among those
// go-fuse knows just before the FORGET let it go, and registers it again
// just after. TestTorture/inotify met it once: after a rename through the
// loop view, the watcher's duplicate invalidation made the kernel forget
// the file while a listing looked it up, and every open of it failed with
// EBADF from then on, its layer node let go. Which of two goroutines inside
// go-fuse wins cannot be chosen from outside, so this test makes the state
// they leave: OnForget called while a LOOKUP is at work, and the kernel
// using the inode after it.
func TestForgetDuringLookup(t *testing.T) {
	lower, st, root := hostStack(t)
	slow := &slowLookup{Node: root, name: "slow", entered: make(chan struct{}), gate: make(chan struct{})}
	mnt := t.TempDir()
	v, srv, err := mount(mnt, st, slow, Options{Timeout: time.Hour, AllowOther: true, Passthrough: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	for _, name := range []string{"f", "slow"} {
		if err := os.WriteFile(filepath.Join(lower, name), []byte("data of "+name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(mnt, "f")
	if _, err := os.ReadFile(f); err != nil {
		t.Fatal(err)
	}
	var a layer.Attr
	n, e := root.Lookup(context.Background(), "f", &a)
	if e != 0 {
		t.Fatal(e)
	}
	tok := n.Token()
	n.Forget()
	var held *inode
	for _, in := range v.cached.Of(tok) {
		if !in.Forgotten() {
			held = in
		}
	}
	if held == nil {
		t.Fatal("the view holds no inode of f after reading it")
	}

	looked := make(chan error, 1)
	go func() {
		_, err := os.Stat(filepath.Join(mnt, "slow"))
		looked <- err
	}()
	select {
	case <-slow.entered:
	case <-time.After(time.Minute):
		t.Fatal("the LOOKUP of slow did not reach the layer within a minute")
	}
	held.OnForget()
	close(slow.gate)
	if err := <-looked; err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(f); err != nil || string(got) != "data of f" {
		t.Fatalf("read f after an OnForget the kernel did not follow: %q, %v", got, err)
	}
}
