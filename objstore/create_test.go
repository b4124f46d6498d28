package objstore

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// TestFormatFailureRemoves: a Format that fails removes the file it made,
// so a retry can succeed, and never removes a file that was there.
func TestFormatFailureRemoves(t *testing.T) {
	path := t.TempDir() + "/store"
	if _, err := Format(path, 1, Options{}); err == nil {
		t.Fatal("Format of 1 byte succeeded")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed Format left %s behind: %v", path, err)
	}
	if _, err := Format(path, 1<<20, Options{Policy: "nope"}); err == nil {
		t.Fatal("Format with an unknown policy succeeded")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed Format left %s behind: %v", path, err)
	}
	s, err := Format(path, 1<<20, Options{})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	s.Close()
	before, _ := os.ReadFile(path)
	if _, err := Format(path, 1<<20, Options{}); err == nil {
		t.Fatal("Format over an existing file succeeded")
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Fatalf("failed Format over an existing store changed or removed it: %v", err)
	}
}
