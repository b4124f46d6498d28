package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// watching runs shale watch with args in the background; its output so
// far is the returned func's.
func watching(t *testing.T, args ...string) func() string {
	t.Helper()
	cmd := exec.Command(shaleBin, append([]string{"watch"}, args...)...)
	var mu sync.Mutex
	var out strings.Builder
	cmd.Stdout = writerFunc(func(b []byte) { mu.Lock(); out.Write(b); mu.Unlock() })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	return func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// waitOutput polls until out has want; a hang guard, far beyond a busy
// machine's need.
func waitOutput(t *testing.T, what string, out func() string, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q in:\n%s", what, want, out())
		}
	}
}

// TestWatchEvents: shale watch names each change as inotifywait would:
// create, modify, rename with the old and new names (in one directory and
// across two), attrib, delete; in words and in JSON. The changes
// are made in LOWER beside the server, one at a time.
func TestWatchEvents(t *testing.T) {
	dir, lower, _ := lowerAndMnt(t)
	sock := filepath.Join(dir, "sock")
	t.Cleanup(func() { os.Remove(markerPath("unix:"+sock, lower)) })
	startServe(t, filepath.Join(dir, "serve.log"), "--listen", "unix:"+sock, lower)
	url := "9p://" + sock
	text, js := watching(t, url), watching(t, "--json", url)
	// It walks the tree before it reports: poll with a change until it
	// shows.
	for i := 0; ; i++ {
		name := filepath.Join(lower, "ready"+strconv.Itoa(i))
		os.WriteFile(name, nil, 0o644)
		if strings.Contains(text(), "create /ready") && strings.Contains(js(), `"path":"/ready`) {
			break
		}
		if i == 3000 {
			t.Fatalf("shale watch reports nothing:\n%s\n%s", text(), js())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := filepath.Join(lower, "d")
	for _, s := range []struct {
		do         func() error
		text, json string
	}{
		{func() error { return os.Mkdir(d, 0o755) }, "create /d\n", `{"event":"create","path":"/d"}`},
		{func() error { return os.WriteFile(filepath.Join(d, "f"), nil, 0o644) }, "create /d/f\n", `{"event":"create","path":"/d/f"}`},
		{func() error {
			f, err := os.OpenFile(filepath.Join(d, "f"), os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				_, err = f.WriteString("more")
				f.Close()
			}
			return err
		}, "modify /d/f\n", `{"event":"modify","path":"/d/f"`},
		// After the rename, not the write: the server's fanotify merges an
		// event of a file with one still queued (the write's close), and
		// then says only that the data changed.
		{func() error { return os.Rename(filepath.Join(d, "f"), filepath.Join(d, "g")) }, "rename /d/f /d/g\n", `{"event":"rename","path":"/d/g","old":"/d/f"}`},
		{func() error { return os.Chmod(filepath.Join(d, "g"), 0o600) }, "attrib /d/g\n", `{"event":"attrib","path":"/d/g"}`},
		{func() error { return os.Rename(filepath.Join(d, "g"), filepath.Join(lower, "h")) }, "rename /d/g /h\n", `{"event":"rename","path":"/h","old":"/d/g"}`},
		{func() error { return os.Remove(filepath.Join(lower, "h")) }, "delete /h\n", `{"event":"delete","path":"/h"}`},
	} {
		if err := s.do(); err != nil {
			t.Fatal(err)
		}
		waitOutput(t, "watch", text, s.text)
		waitOutput(t, "watch --json", js, s.json)
	}
	if out := text(); strings.Contains(out, "delete /d/") || strings.Contains(out, "create /d/g") || strings.Contains(out, "create /h") {
		t.Errorf("a rename reported as a delete and a create:\n%s", out)
	}
}
