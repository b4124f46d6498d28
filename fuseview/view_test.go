package fuseview

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// hostStack is a stack over a new lower directory, to mount as root (the
// tests need it).
func hostStack(t *testing.T) (string, *stack.Stack, layer.Node) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts FUSE file systems: run it as root")
	}
	lower := t.TempDir()
	st := stack.New(stack.Options{})
	root, err := hostfs.New(st, lower)
	if err != nil {
		t.Fatal(err)
	}
	return lower, st, root
}

// One process serves two mounts of one lower directory: what is written
// through one is read through the other, and a lock taken through one
// conflicts with a lock through the other, because both views share the
// lower layer's lock table.
func TestTwoMountsInOneProcess(t *testing.T) {
	lower, st, root := hostStack(t)
	var mnts [2]string
	for i := range mnts {
		mnts[i] = t.TempDir()
		srv, err := Mount(mnts[i], st, root, Options{Timeout: 0, AllowOther: true, Passthrough: true, Source: lower})
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

// With passthrough the kernel maps the host file itself, so a change made
// directly in the lower directory shows at once in a mapping made through
// the mount; without it the mount's own page cache keeps the old bytes.
// That tells the two data paths apart. The mapping is made in a child
// process: a page fault on our own mount would stall this one's garbage
// collector, which waits for the faulting thread while it waits for us.
func TestPassthroughServesTheHostFile(t *testing.T) {
	for _, pt := range []bool{true, false} {
		lower, st, root := hostStack(t)
		mnt := t.TempDir()
		srv, err := Mount(mnt, st, root, Options{Timeout: time.Second, Passthrough: pt, Source: lower})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lower, "f"), []byte("old!"), 0o644); err != nil {
			t.Fatal(err)
		}
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), mapHelperEnv+"="+filepath.Join(mnt, "f"))
		in, _ := child.StdinPipe()
		out, _ := child.StdoutPipe()
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(out)
		if l, err := r.ReadString('\n'); l != "mapped old!\n" {
			t.Fatalf("mapping child: %q %v", l, err)
		}
		if err := os.WriteFile(filepath.Join(lower, "f"), []byte("new!"), 0o644); err != nil {
			t.Fatal(err)
		}
		in.Write([]byte("go\n"))
		got, _ := r.ReadString('\n')
		child.Wait()
		if err := srv.Unmount(); err != nil {
			t.Error(err)
		}
		root.Forget()
		if want := map[bool]string{true: "new!", false: "old!"}[pt]; strings.TrimSpace(got) != want {
			t.Errorf("passthrough=%v: mapping shows %q, want %q", pt, got, want)
		}
	}
}

// A program reading a file while another rewrites it (open O_TRUNC,
// write) through the same mount reads the old bytes, the new or none,
// never zeros: without atomic O_TRUNC the kernel truncated with a SETATTR
// during which it ignores the size a READ finds, and kept the old size
// over a page padded with zeros (one read in six here).
func TestRewriteWhileReading(t *testing.T) {
	lower, st, root := hostStack(t)
	mnt := t.TempDir()
	// As shale mount makes it, but for passthrough, which serves data
	// without us, and with the poll hack: this process reads the mount.
	srv, err := Mount(mnt, st, root, Options{Timeout: time.Hour, AllowOther: true, Coherent: true, KeepCache: true, Source: lower})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Unmount()
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, []byte("v0"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var reads, zeros int
	go func() {
		defer close(done)
		for v := 1; v <= 3000; v++ {
			if err := os.WriteFile(p, []byte(fmt.Sprintf("v%d%s", v, strings.Repeat(".", v%7))), 0o644); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for {
		select {
		case <-done:
			t.Logf("%d reads while rewriting, %d with zeros", reads, zeros)
			if zeros > 0 {
				t.Errorf("%d of %d reads found zeros", zeros, reads)
			}
			return
		default:
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		reads++
		if strings.IndexByte(string(b), 0) >= 0 {
			zeros++
		}
	}
}

const mapHelperEnv = "FUSEVIEW_TEST_MAP"

// TestMain runs the mapping child when asked to: map the file, say
// "mapped", and on a line from the parent print what the mapping shows;
// or the locking child (lockChild).
func TestMain(m *testing.M) {
	if path := os.Getenv(lockHelperEnv); path != "" {
		lockChild(path)
	}
	if path := os.Getenv(mapHelperEnv); path != "" {
		f, err := os.Open(path)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		mem, err := unix.Mmap(int(f.Fd()), 0, 4, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("mapped " + string(mem)) // the copy faults the page in
		bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Println(string(mem))
		os.Exit(0)
	}
	os.Exit(m.Run())
}
