package fuseview

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/hostfs"
)

// One process serves two mounts of one lower directory: what is written
// through one is read through the other, and a lock taken through one
// conflicts with a lock through the other, because both views share the
// lower layer's lock table.
func TestTwoMountsInOneProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts FUSE file systems: run it as root")
	}
	lower := t.TempDir()
	root, err := hostfs.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	var mnts [2]string
	for i := range mnts {
		mnts[i] = t.TempDir()
		srv, err := Mount(mnts[i], root, Options{Timeout: 0, AllowOther: true, Passthrough: true, Source: lower})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := srv.Unmount(); err != nil {
				t.Errorf("unmount %s: %v", mnts[i], err)
			}
		})
	}
	a, b := filepath.Join(mnts[0], "f"), filepath.Join(mnts[1], "f")
	if err := os.WriteFile(a, []byte("from a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(b); err != nil || string(got) != "from a" {
		t.Fatalf("read through the second mount: %q, %v", got, err)
	}

	fa, err := os.OpenFile(a, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.OpenFile(b, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	// Open file description locks: each open file is its own owner, so
	// one process can show the conflict.
	wr := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 10}
	if err := unix.FcntlFlock(fa.Fd(), unix.F_OFD_SETLK, &wr); err != nil {
		t.Fatalf("lock through the first mount: %v", err)
	}
	if err := unix.FcntlFlock(fb.Fd(), unix.F_OFD_SETLK, &wr); err != syscall.EAGAIN {
		t.Fatalf("conflicting lock through the second mount: %v, want EAGAIN", err)
	}
	if err := syscall.Flock(int(fa.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock through the first mount: %v", err)
	}
	if err := syscall.Flock(int(fb.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != syscall.EWOULDBLOCK {
		t.Fatalf("flock through the second mount: %v, want EWOULDBLOCK", err)
	}
	// A blocking request waits for the release.
	done := make(chan error)
	go func() { done <- unix.FcntlFlock(fb.Fd(), unix.F_OFD_SETLKW, &wr) }()
	time.Sleep(50 * time.Millisecond)
	unlock := unix.Flock_t{Type: unix.F_UNLCK, Len: 10}
	if err := unix.FcntlFlock(fa.Fd(), unix.F_OFD_SETLK, &unlock); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting lock after release: %v", err)
	}
}
