package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/stack"
)

// slow bounds what must not hang: generous, the machine is shared.
const slow = 60 * time.Second

// The server dies in the middle of writes: requests in flight fail with
// EIO, as do requests made while it is away; when it is back the client
// reconnects on its own, the handle opens again, and what was fsynced
// before the kill is intact.
func TestReconnect(t *testing.T) {
	servers(t, func(t *testing.T, mk func(t *testing.T) server) {
		srv := mk(t)
		root, _ := mount(t, srv)
		var a layer.Attr
		f, h, e := root.Create(bg, "f", unix.O_RDWR, 0o644, &a)
		must(t, e, "create")
		defer h.Release(bg)
		synced := make([]byte, 1<<20)
		rand.Read(synced)
		_, e = h.Write(bg, synced, 0)
		must(t, e, "write")
		must(t, h.Fsync(bg, false), "fsync")

		_, isDiod := srv.(*diodServer)
		if isDiod {
			lk := &layer.Lock{Type: syscall.F_WRLCK, End: math.MaxUint64}
			must(t, h.Setlk(bg, 9, lk, false), "lock before the loss")
		}

		// A writer that keeps the connection busy until it fails.
		failed := make(chan layer.Errno, 1)
		go func() {
			chunk := make([]byte, 256<<10)
			for off := int64(len(synced)); ; off += int64(len(chunk)) {
				if _, e := h.Write(bg, chunk, off); e != 0 {
					failed <- e
					return
				}
				if off > 1<<30 {
					failed <- 0
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		srv.kill(t)
		select {
		case e := <-failed:
			if e != syscall.EIO {
				t.Fatalf("in-flight write: %v, want EIO", e)
			}
		case <-time.After(slow):
			t.Fatal("in-flight write hangs after the server died")
		}

		// While the server is away, a request waits for it, then fails.
		start := time.Now()
		if e := f.Getattr(bg, nil, &a); e != syscall.EIO {
			t.Fatalf("getattr while disconnected: %v, want EIO", e)
		}
		if d := time.Since(start); d > slow {
			t.Fatalf("getattr while disconnected took %v", d)
		}

		srv.start(t)
		deadline := time.Now().Add(slow)
		for f.Getattr(bg, nil, &a) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("no reconnect")
			}
			time.Sleep(100 * time.Millisecond)
		}
		got := make([]byte, len(synced))
		k, e := h.Read(bg, got, 0)
		must(t, e, "read through the reopened handle")
		if k != len(got) || !bytes.Equal(got, synced) {
			t.Fatalf("fsynced data: read %d bytes, not what was written", k)
		}
		disk, err := os.ReadFile(filepath.Join(serverDir(srv), "f"))
		if err != nil || !bytes.Equal(disk[:len(synced)], synced) {
			t.Fatalf("fsynced data on the server: %v", err)
		}
		lookup(t, root, "f")
		if isDiod {
			lk := &layer.Lock{Type: syscall.F_WRLCK, End: math.MaxUint64}
			if e := h.Setlk(bg, 9, lk, false); e != syscall.EIO {
				t.Fatalf("first lock call after the loss: %v, want EIO", e)
			}
			must(t, h.Setlk(bg, 9, lk, false), "lock again")
		}
	})
}

// A stopped server (SIGSTOP: the connection stays up, nothing answers)
// makes requests fail with EIO after the timeout, not hang; once it runs
// again, the client has a new connection.
func TestStoppedServer(t *testing.T) {
	srv := newDiod(t)
	root, _ := mount(t, srv)
	var a layer.Attr
	must(t, root.Getattr(bg, nil, &a), "getattr")
	srv.cmd.Process.Signal(syscall.SIGSTOP)
	// kill(2) returns before the group stop: one thread takes the signal
	// and stops the others when it next runs, and until then diod's
	// threads still answer (a busy machine made that tens of ms).
	waitStopped(t, srv.cmd.Process.Pid)
	start := time.Now()
	done := make(chan layer.Errno, 1)
	go func() { done <- root.Getattr(bg, nil, &a) }()
	select {
	case e := <-done:
		if e != syscall.EIO {
			t.Fatalf("getattr of a stopped server: %v, want EIO", e)
		}
		if d := time.Since(start); d < testTimeout/2 {
			t.Fatalf("failed after %v, before the timeout", d)
		}
	case <-time.After(slow):
		t.Fatal("getattr of a stopped server hangs")
	}
	srv.cmd.Process.Signal(syscall.SIGCONT)
	deadline := time.Now().Add(slow)
	for root.Getattr(bg, nil, &a) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("no reconnect after SIGCONT")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStopped waits until every thread of process pid is stopped.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	task := fmt.Sprintf("/proc/%d/task", pid)
	for deadline := time.Now().Add(slow); ; time.Sleep(5 * time.Millisecond) {
		tids, err := os.ReadDir(task)
		if err != nil {
			t.Fatal(err)
		}
		stopped := 0
		for _, tid := range tids {
			// The state follows the command's closing parenthesis.
			b, _ := os.ReadFile(filepath.Join(task, tid.Name(), "stat"))
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
				stopped++
			}
		}
		if stopped == len(tids) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d: %d of %d threads stopped after SIGSTOP", pid, stopped, len(tids))
		}
	}
}

// A server that takes the version and then never answers: New fails
// within the timeout instead of hanging.
func TestSilentServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				hdr := make([]byte, 7)
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				io.CopyN(io.Discard, c, int64(binary.LittleEndian.Uint32(hdr))-7)
				r := p9wire.Msg(p9wire.Tversion+1, p9wire.NoTag) // Rversion: msize, version
				r.U32(8192)
				r.Str(p9wire.Version)
				c.Write(r.Frame())
				io.Copy(io.Discard, c) // and never a word more
			}()
		}
	}()
	start := time.Now()
	r := p9net.Remote{Addr: p9net.Addr{Network: "unix", Address: sock}}
	_, err = New(context.Background(), stack.New(stack.Options{}), r, Options{Timeout: testTimeout})
	if err == nil {
		t.Fatal("attached to a server that does not answer")
	}
	if d := time.Since(start); d > slow {
		t.Fatalf("New took %v", d)
	}
}
