package net

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mapShared maps the first n bytes of f shared and writable.
func mapShared(f *os.File, n int) ([]byte, error) {
	return unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// TestSharedMappingAcrossClients (issue 23): a file mapped shared and
// writable on client A cannot be kept coherent with a mapping on client
// B (each kernel's pages are its own), so B's shared mapping of it fails
// while A has it open, loudly (ENODEV, which SQLite reports as a disk
// I/O error), instead of two mappings silently diverging. A mapping on
// one client at a time works, and what it stored the next opener reads.
func TestSharedMappingAcrossClients(t *testing.T) {
	_, _, url := cacheServer(t, 0)
	a, b := mount(t, url), mount(t, url)
	const size = 1 << 15 // SQLite's -shm regions are 32 KiB
	writeFile(t, filepath.Join(a, "shm"), make([]byte, size), 0o644)
	openRW := func(dir string) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, "shm"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	// One client at a time: close-to-open, as for write(2).
	fa := openRW(a)
	m, err := mapShared(fa, size)
	if err != nil {
		t.Fatalf("A's shared mapping, the file open nowhere else: %v", err)
	}
	copy(m, "stored by A")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	unix.Munmap(m)
	fa.Close()
	if got, err := os.ReadFile(filepath.Join(b, "shm")); err != nil || string(got[:11]) != "stored by A" {
		t.Fatalf("B read %q after A's mapping was closed (%v)", got[:11], err)
	}

	// A holds a shared writable mapping; B's fails. B's read closed the
	// file, but its RELEASE may reach the server after A's open on a
	// busy machine: the file is then write-shared for that open.
	fa, ma := mapAlone(t, a, openRW, size)
	copy(ma, "A again")
	fb := openRW(b)
	if mb, err := mapShared(fb, size); err == nil {
		copy(mb, "B's store")
		unix.Munmap(mb)
		t.Fatal("B mapped the file shared and writable while A has it mapped: the two cannot be coherent")
	} else if !errors.Is(err, syscall.ENODEV) {
		t.Fatalf("B's shared mapping failed with %v, want ENODEV", err)
	}
	// A private mapping (a program's text) and reads still work.
	if mp, err := unix.Mmap(int(fb.Fd()), 0, size, unix.PROT_READ, unix.MAP_PRIVATE); err != nil {
		t.Errorf("B's private mapping: %v", err)
	} else {
		unix.Munmap(mp)
	}
	if _, err := fb.ReadAt(make([]byte, 1), 0); err != nil {
		t.Errorf("B's read: %v", err)
	}
	fb.Close()
	unix.Munmap(ma)
	fa.Close()

	// Shared by nobody any more: B may map it, once A's close reached the
	// server.
	fb, mb := mapAlone(t, b, openRW, size)
	if string(mb[:7]) != "A again" {
		t.Errorf("B's mapping shows %q, want A's store", mb[:7])
	}
	unix.Munmap(mb)
	fb.Close()
}

// mapAlone opens dir's shm and maps it shared and writable, once no other
// client has it open: the kernel sends FUSE's RELEASE after close(2)
// returns, so an open may still find another client's for a moment, and
// be write-shared (ENODEV).
func mapAlone(t *testing.T, dir string, openRW func(string) *os.File, size int) (*os.File, []byte) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f := openRW(dir)
		m, err := mapShared(f, size)
		if err == nil {
			return f, m
		}
		f.Close()
		if !errors.Is(err, syscall.ENODEV) || time.Now().After(deadline) {
			t.Fatalf("%s: a shared mapping of a file no other client has open: %v", dir, err)
		}
	}
}
