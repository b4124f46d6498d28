package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBackgroundLog: a background mount logs to the system's log by
// default: the journal where its socket is, else syslog's /dev/log, else
// a file in the state directory, which says why. Each case runs in a
// mount namespace whose /run (and /dev) are the test's, with a datagram
// socket of the test's bound where the system's log would listen.
func TestBackgroundLog(t *testing.T) {
	const (
		private = `mount --make-rprivate / && mount -t tmpfs none /run && `
		newDev  = `mount -t tmpfs none /dev && mknod -m 666 /dev/fuse c 10 229 && mknod -m 666 /dev/null c 1 3 && `
	)
	for _, c := range []struct {
		name, setup string
		want        []string
	}{
		{"journal", private + `mkdir -p /run/systemd/journal && touch /run/systemd/journal/socket && mount --bind "$0/log.sock" /run/systemd/journal/socket`,
			[]string{"MESSAGE=mounted lower=", "PRIORITY=6\n", "SYSLOG_IDENTIFIER=shale\n"}},
		{"syslog", private + newDev + `touch /dev/log && mount --bind "$0/log.sock" /dev/log`,
			[]string{"<30>", " shale[", "]: mounted lower="}},
		{"none", private + newDev + `mount --bind "$0/state" /var/lib/shale`,
			[]string{"logging to /var/lib/shale/shale.log", `why="no journal`, "msg=mounted lower="}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, lower, mnt := lowerAndMnt(t)
			sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "log.sock"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer sock.Close()
			os.MkdirAll("/var/lib/shale", 0o755) // the state directory, as root
			os.Mkdir(filepath.Join(dir, "state"), 0o755)
			// A fallback log past its size is moved aside first.
			big := filepath.Join(dir, "state", "shale.log")
			os.WriteFile(big, []byte("old\n"), 0o644)
			os.Truncate(big, fallbackLogMax+1)
			cmd := exec.Command("unshare", "-m", "sh", "-c", c.setup+` && exec "$1" mount "$2" "$3"`, dir, shaleBin, lower, mnt)
			if code, out := runCmd(t, cmd); code != 0 {
				t.Fatalf("shale mount: exit %d: %s", code, out)
			}
			// The mount is in the namespace; its process is ours to end.
			pid := servingPid(t, mnt)
			defer func() {
				syscall.Kill(pid, syscall.SIGTERM)
				waitGone(t, pid)
			}()
			var got string
			if c.name == "none" {
				b, _ := os.ReadFile(filepath.Join(dir, "state", "shale.log"))
				got = string(b)
				if fi, err := os.Stat(big + ".1"); err != nil || fi.Size() != fallbackLogMax+1 {
					t.Errorf("the full log was not moved to shale.log.1: %v", err)
				}
			} else {
				// A hang guard: the line was sent before the mount returned.
				sock.SetReadDeadline(time.Now().Add(time.Minute))
				for !strings.Contains(got, "mounted") {
					b := make([]byte, 1<<16)
					n, err := sock.Read(b)
					if err != nil {
						t.Fatalf("no log line of the mount: %v (so far %q)", err, got)
					}
					got += string(b[:n])
				}
			}
			for _, want := range append(c.want, "mountpoint="+mnt) {
				if !strings.Contains(got, want) {
					t.Errorf("log %q lacks %q", got, want)
				}
			}
		})
	}
}
