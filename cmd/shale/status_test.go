package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statusOf is the line of shale status that begins with where.
func statusOf(t *testing.T, where string) string {
	t.Helper()
	code, out := run(t, "status")
	if code != 0 {
		t.Fatalf("shale status: exit %d: %s", code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, where+" ") {
			return line
		}
	}
	t.Fatalf("shale status has no line for %s:\n%s", where, out)
	return ""
}

// TestStatus: shale status lists a local mount, a mount of a 9P tree and
// the server, each with its stack, LOWER, pid and uptime, and the state
// of the network mount; shale stats answers for the local mount too.
func TestStatus(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	if code, out := run(t, "mount", "--layer", "rot13", lower, mnt); code != 0 {
		t.Fatalf("shale mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	pid := servingPid(t, mnt)
	line := regexp.QuoteMeta(mnt) + ` +rot13 +` + regexp.QuoteMeta(lower) + ` +` + strconv.Itoa(pid) + ` +\d+s +serving$`
	if got := statusOf(t, mnt); !regexp.MustCompile(line).MatchString(got) {
		t.Errorf("status of the local mount: %q, want %q", got, line)
	}
	code, out := run(t, "stats", mnt)
	if code != 0 || !strings.Contains(out, "stack      rot13\npid        "+strconv.Itoa(pid)+", up ") {
		t.Errorf("shale stats of a local mount: exit %d:\n%s", code, out)
	}

	slower, mnt2 := filepath.Join(dir, "served"), filepath.Join(dir, "mnt2")
	os.Mkdir(slower, 0o755)
	os.Mkdir(mnt2, 0o755)
	addr := freePort(t)
	t.Cleanup(func() { os.Remove(markerPath("tcp:"+addr, slower)) })
	srv := startServe(t, filepath.Join(dir, "serve.log"), "--listen", "tcp:"+addr, "--no-root-squash", slower)
	if code, out := run(t, "mount", "--write-delay", "1m", "9p://"+addr+"/", mnt2); code != 0 {
		t.Fatalf("shale mount 9p: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt2, syscall.MNT_DETACH) })
	f, err := os.Create(filepath.Join(mnt2, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(make([]byte, 5000))
	if got := statusOf(t, mnt2); !regexp.MustCompile(` +loop +9p://` + regexp.QuoteMeta(addr) + `/ +\d+ +\d+s +connected, 4\.9 KiB dirty in 1 files$`).MatchString(got) {
		t.Errorf("status of the 9P mount: %q", got)
	}
	// The mount's connection, and perhaps the last status's dial still.
	if got := statusOf(t, "serve tcp:"+addr); !regexp.MustCompile(` +loop +` + regexp.QuoteMeta(slower) + ` +` + strconv.Itoa(srv.Process.Pid) + ` +\d+s +exports "" \(layer 0\), [12] clients$`).MatchString(got) {
		t.Errorf("status of the server: %q", got)
	}
	// Completion offers the server's URL, and the mounts to umount.
	for _, args := range [][]string{{"mount", "9p"}, {"watch", ""}, {"stats", ""}} {
		if code, out := run(t, append([]string{"__complete"}, args...)...); code != 0 || !strings.Contains("\n"+out, "\n9p://"+addr+"/\tshale serve "+slower+"\n") {
			t.Errorf("%q completes %q, want 9p://%s/", args, out, addr)
		}
	}
	if code, out := run(t, "__complete", "umount", ""); code != 0 || !strings.Contains(out, mnt2+"\t9p://"+addr+"/\n") {
		t.Errorf("umount completes %q, want %s", out, mnt2)
	}
	// The server's statistics as tables like the client's, on a terminal
	// or not (here, a pipe); as JSON or raw for scripts.
	code, out = run(t, "stats", "--server", addr)
	for _, want := range []string{"\nbytes        ", "\nrequests   ", "\n  Tattach ", "\nSprite (", "\n  for writing ", "\nwrite-backs  "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("shale stats --server: exit %d, no %q:\n%s", code, want, out)
		}
	}
	if code, out := run(t, "stats", "--json", "--server", addr); code != 0 || !strings.Contains(out, `"sprite.opens.write":1,`) {
		t.Errorf("shale stats --json --server: exit %d:\n%s", code, out)
	}
	if code, out := run(t, "stats", "--format", "raw", "--server", addr); code != 0 || !strings.Contains(out, "\nsprite.opens.write 1\n") {
		t.Errorf("shale stats --format raw --server: exit %d:\n%s", code, out)
	}
	// The mount's own session: lost with its server, and why; found
	// again when a server answers at the address.
	f.Sync()
	stopServe(t, srv, syscall.SIGTERM)
	down := regexp.MustCompile(`disconnected [\dhms]+ ago \(.*connection refused.*\), not cached, 0 B dirty in 0 files$`)
	statusUntil(t, mnt2, down)
	if code, out := run(t, "stats", mnt2); code != 0 || !strings.Contains(out, "\ncaching    off until the server answers again (journal ") {
		t.Errorf("shale stats of a 9P mount, its server gone: exit %d:\n%s", code, out)
	}
	startServe(t, filepath.Join(dir, "serve.log"), "--listen", "tcp:"+addr, "--no-root-squash", slower)
	statusUntil(t, mnt2, regexp.MustCompile(` connected, 1 reconnections \(last error [\dhms]+ ago: .*connection refused.*\), 0 B dirty in 0 files$`))
	code, out = run(t, "status", "--json")
	if code != 0 || !strings.Contains(out, `"session":{"connected":true,`) || !strings.Contains(out, `"losses":1,"restored":1,`) {
		t.Errorf("shale status --json: exit %d:\n%s", code, out)
	}
}

// statusUntil polls shale status until the line of where matches rx.
func statusUntil(t *testing.T, where string, rx *regexp.Regexp) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := statusOf(t, where)
		if rx.MatchString(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s: %q after 60s, want %s", where, got, rx)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
