package fuseview

import (
	"context"
	"os"
	"path/filepath"
	"slices"
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

// Racing lookups of one file (two names of it, or a revalidation beside
// a lookup) each make an inode; go-fuse links the first registered after
// the replies and drops the others. An inode not linked yet must not be
// dropped from the view's record as forgotten: a racing lookup's record
// then held only its own losing inode, and no change reached the
// kernel's caches of the file again until the kernel forgot it
// (test/volume TestTwoMountsChurn read a size and pages an hour old).
func TestRacingLookupsKeepTheWinner(t *testing.T) {
	_, _, root := hostStack(t)
	v := &view{}
	done := v.makers.start() // the lookups at work
	first := v.newInode(root)
	v.hold(first) // the winner: go-fuse links it after its reply
	second := v.newInode(root)
	v.hold(second) // the racing lookup's, which will lose
	if !slices.Contains(v.cached.Of(root.Token()), first) {
		t.Fatal("a racing lookup dropped the inode made first, not linked yet, from the view's record")
	}
	done()
	// Both ended: neither was linked here, so both are forgotten and go
	// at the next record.
	third := v.newInode(root)
	v.hold(third)
	if got := v.cached.Of(root.Token()); slices.Contains(got, first) || slices.Contains(got, second) {
		t.Fatalf("inodes forgotten after their requests ended are kept: %d held", len(got))
	}
}
