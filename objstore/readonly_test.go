package objstore

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// TestReadOnly: a store whose file is mode 0444 opens with ReadOnly and
// reads; nothing is written, even as root (who could have written): the
// file's bytes and mtime are the same after reads, a miss, failed puts and
// removes, and Close. A store closed uncleanly opens read-only with every
// object a miss and stays dirty.
func TestReadOnly(t *testing.T) {
	path := formatClosed(t, 1<<20)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := Generate("a", 5000)
	if err := s.Create("a", data); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st0, _ := os.Stat(path)

	for i := 0; i < 2; i++ {
		s, err := Open(path, Options{ReadOnly: true})
		if err != nil {
			t.Fatalf("read-only open of a 0444 store: %v", err)
		}
		if got, err := s.Read("a"); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read-only read: %v", err)
		}
		if _, err := s.Read("b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("read-only miss: %v", err)
		}
		if err := s.Create("b", data); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("read-only create: %v, want ErrReadOnly", err)
		}
		if err := s.Remove("a"); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("read-only remove: %v, want ErrReadOnly", err)
		}
		if st := s.Stats(); st.Objects != 1 || !st.CleanOpen {
			t.Fatalf("read-only stats: %+v", st)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("read-only close: %v", err)
		}
	}
	after, _ := os.ReadFile(path)
	st1, _ := os.Stat(path)
	if !bytes.Equal(before, after) || !st0.ModTime().Equal(st1.ModTime()) {
		t.Fatalf("a read-only open wrote to the store")
	}

	// Dirty: an owner that did not close. The reader sees misses and
	// leaves the store dirty.
	os.Chmod(path, 0o644)
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.dev.close() // as if the owner died
	r, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read-only read of a dirty store: %v, want a miss", err)
	}
	if r.Stats().CleanOpen {
		t.Fatalf("dirty store opened clean")
	}
	r.Close()
	if sb := readSuperForTest(t, path); sb.state != stateDirty {
		t.Fatalf("read-only close marked a dirty store clean")
	}
}
