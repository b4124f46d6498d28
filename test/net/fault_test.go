package net

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestServerKilled: kill -9 of the server while a client writes, then a new
// server on the same socket. The writer gets an error, not a hang; after
// the restart the client reconnects by itself, what was fsynced before the
// kill reads back intact, and nothing reads back wrong.
func TestServerKilled(t *testing.T) {
	lower := tempDir(t)
	sock := filepath.Join(tempDir(t), "s.sock")
	s := serve(t, sock, "--no-root-squash", lower)
	m := mount(t, "9p://"+sock+"?timeout=5s")

	safe := randomBytes(t, 3<<20)
	f, err := os.Create(filepath.Join(m, "safe"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(safe); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// A writer that fsyncs every chunk and remembers how much is durable.
	chunk := randomBytes(t, 256<<10)
	type result struct {
		synced int64
		err    error
	}
	done := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		f, err := os.Create(filepath.Join(m, "busy"))
		if err != nil {
			done <- result{0, err}
			return
		}
		defer f.Close()
		var synced int64
		for i := 0; ; i++ {
			if _, err := f.Write(chunk); err != nil {
				done <- result{synced, err}
				return
			}
			if err := f.Sync(); err != nil {
				done <- result{synced, err}
				return
			}
			synced += int64(len(chunk))
			if i == 3 {
				close(started)
			}
		}
	}()
	select {
	case <-started:
	case r := <-done:
		t.Fatalf("the writer stopped before the kill: %v", r.err)
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done

	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("a write hung after the server was killed")
	}
	if !errors.Is(r.err, syscall.EIO) && !errors.Is(r.err, syscall.ENOTCONN) {
		t.Errorf("the writer's error after the kill: %v, want EIO", r.err)
	}

	serve(t, sock, "--no-root-squash", lower)
	var got []byte
	deadline := time.Now().Add(time.Minute)
	for {
		got, err = os.ReadFile(filepath.Join(m, "safe"))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || !bytes.Equal(got, safe) {
		t.Fatalf("after the restart, safe: %v, %d bytes, intact %v", err, len(got), bytes.Equal(got, safe))
	}
	busy, err := os.ReadFile(filepath.Join(m, "busy"))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(busy)) < r.synced {
		t.Errorf("busy has %d bytes, %d were fsynced", len(busy), r.synced)
	}
	for off := 0; off < len(busy); off += len(chunk) {
		end := min(off+len(chunk), len(busy))
		if !bytes.Equal(busy[off:end], chunk[:end-off]) {
			t.Fatalf("busy differs from what was written at %d", off)
		}
	}
	// Writes are delayed (Sprite's rules): fsync sends them.
	syncFile(t, filepath.Join(m, "after"), []byte("new"))
	if b, err := os.ReadFile(filepath.Join(lower, "after")); err != nil || string(b) != "new" {
		t.Errorf("a write after the restart, fsynced: %q, %v", b, err)
	}
}
