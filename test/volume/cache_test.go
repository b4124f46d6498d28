package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestTwoMountsChurn: one client creates, rewrites, renames, links and
// removes names while the other lists, stats and reads them, its lookups
// and stats answered by its metadata cache (docs/volume.md). A read on
// the other client right after the writer's close that opens the file
// the name leads to returns what was written (close-to-open); once the writer stops, the other client's names, sizes, link counts and
// contents come to the writer's, by the watch, and stay so.
func TestTwoMountsChurn(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	A := func(p string) string { return filepath.Join(a, "d", p) }
	B := func(p string) string { return filepath.Join(b, "d", p) }
	if err := os.MkdirAll(A("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, "d/sub", func() (string, bool) { _, err := os.Stat(B("sub")); return fmt.Sprint(err), err == nil })
	names := []string{"n0", "n1", "n2", "n3", "n4", "n5", "sub/n6", "sub/n7", "sub/n8"}

	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // the other client, throughout
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.ReadDir(B(""))
			os.ReadDir(B("sub"))
			os.Lstat(B(names[rand.IntN(len(names))]))
			os.ReadFile(B(names[rand.IntN(len(names))]))
		}
	}()

	// check reads name on the other client at once, as a fresh open: if
	// that open found the file the writer's name leads to now (the same
	// inode number), it must read what the writer last wrote and closed
	// (data: close-to-open). Another file is a name the watch has not
	// delivered yet: a lag, counted, not an error.
	stale, lags := 0, 0
	check := func(op int, name string) {
		want, err := os.ReadFile(A(name))
		if err != nil {
			return
		}
		var sa syscall.Stat_t
		if syscall.Stat(A(name), &sa) != nil {
			return
		}
		f, err := os.Open(B(name))
		if err != nil {
			return // not there yet, or ESTALE twice over
		}
		defer f.Close()
		var sb syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.Ino != sa.Ino {
			lags++
			return
		}
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, want) {
			stale++
			t.Errorf("op %d: %s read %.20q (%d bytes, %v) on the other client after the writer's close, want %.20q (%d bytes)", op, name, got, len(got), err, want, len(want))
		}
	}
	for i := range 300 {
		x, y := names[rand.IntN(len(names))], names[rand.IntN(len(names))]
		switch rand.IntN(5) {
		case 0, 1:
			want := fmt.Sprintf("%s version %d %s", x, i, make([]byte, rand.IntN(40000)))
			if err := os.WriteFile(A(x), []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			check(i, x)
		case 2:
			if os.Rename(A(x), A(y)) == nil {
				check(i, y)
			}
		case 3:
			os.Link(A(x), A(y))
		case 4:
			os.Remove(A(x))
		}
	}
	close(stop)
	<-done
	t.Logf("%d reads of a name the watch had not yet moved", lags)
	if stale > 0 {
		t.Fatalf("%d stale reads", stale)
	}

	// The writer's view, and the other client's until it is the same.
	view := func(root func(string) string) (string, error) {
		s := ""
		for _, dir := range []string{"", "sub"} {
			ents, err := os.ReadDir(root(dir))
			if err != nil {
				return "", err
			}
			for _, e := range ents {
				p := filepath.Join(dir, e.Name())
				var st syscall.Stat_t
				if err := syscall.Lstat(root(p), &st); err != nil {
					return "", fmt.Errorf("listed %s, stat: %w", p, err)
				}
				s += fmt.Sprintf("%s %o size %d links %d", p, st.Mode, st.Size, st.Nlink)
				if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
					data, err := os.ReadFile(root(p))
					if err != nil {
						return "", fmt.Errorf("listed %s, read: %w", p, err)
					}
					s += fmt.Sprintf(" %.20q", data)
				}
				s += "\n"
			}
		}
		return s, nil
	}
	want, err := view(A)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err = view(B)
		if err == nil && got == want {
			break
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESTALE) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s the other client sees\n%s(%v)\nthe writer\n%s", got, err, want)
		}
	}
	for range 3 {
		if got, err := view(B); err != nil || got != want {
			t.Fatalf("the other client's view changed back:\n%s(%v)\nwant\n%s", got, err, want)
		}
	}
}
