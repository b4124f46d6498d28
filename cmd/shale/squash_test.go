package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRootSquashExplained: root's write through a mount of a server that
// squashes root fails with EACCES, and both ends say why: the server's
// log once for the client, naming it and --no-root-squash, and the
// mount's log; the server's stats count the refusals.
func TestRootSquashExplained(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	sock := filepath.Join(dir, "sock")
	slog, mlog := filepath.Join(dir, "serve.log"), filepath.Join(dir, "mount.log")
	t.Cleanup(func() { os.Remove(markerPath("unix:"+sock, lower)) })
	startServe(t, slog, "--listen", "unix:"+sock, lower)
	if code, out := run(t, "mount", "--log", mlog, "9p://"+sock, mnt); code != 0 {
		t.Fatalf("shale mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })

	for _, name := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(mnt, name), nil, 0o644); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("root's create through a squashing server: %v, want EACCES", err)
		}
	}
	const serverSays = "refused a request of a client's root, which acts as nobody (65534) here (root squash): serve with --no-root-squash"
	const mountSays = "it squashes root, which acts as nobody (65534) there; start shale serve with --no-root-squash"
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, _ := os.ReadFile(slog)
		m, _ := os.ReadFile(mlog)
		if strings.Contains(string(s), serverSays) && strings.Contains(string(m), mountSays) {
			if n := strings.Count(string(s), serverSays); n != 1 {
				t.Errorf("the server says it %d times for one client, want once:\n%s", n, s)
			}
			if !strings.Contains(string(s), `client="unix socket peer, which may act as any user"`) || !strings.Contains(string(s), "request=Tlcreate") {
				t.Errorf("the server's line names no client or request:\n%s", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s, no explanation of the refusals:\nserver's log:\n%s\nmount's log:\n%s", s, m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m, _ := os.ReadFile(mlog); strings.Count(string(m), mountSays) != 1 {
		t.Errorf("the mount says it more than once:\n%s", m)
	}
	code, out := run(t, "stats", "--json", "--server", "unix:"+sock)
	var v map[string]uint64
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v["squash.refused"] != 3 {
		t.Errorf("shale stats --json --server: exit %d, %v, want squash.refused 3:\n%s", code, err, out)
	}
}
