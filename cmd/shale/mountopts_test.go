package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/stack"
)

// sharedDir returns a new directory to mount under, made a shared mount:
// mounts that mount8 makes under it in its own namespace show here, and
// unmounting them here ends them there.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	return dir
}

// mount8Script runs mount(8) ("$@") in a mount namespace of its own where
// the shale under test is the one mount.fuse3 runs. mount(8) clears PATH,
// so the shell that mount.fuse3 starts looks in its default one, first in
// /usr/local/sbin: the namespace has the test binary's directory there,
// and nothing is installed on the machine.
const mount8Script = `set -e
dir=$1 bin=$2
shift 2
# Copies of FUSE mounts made elsewhere would keep those file systems, and
# their servers, alive as long as this namespace: drop them here, made
# private first so that dropping them does not propagate back.
awk -v dir="$dir/" '{ i = 7; while ($i != "-") i++ }
	$(i+1) ~ /^fuse/ && $(i+1) != "fusectl" && index($5 "/", dir) != 1 { print $5 }' /proc/self/mountinfo |
while read -r m; do
	{ mount --make-private "$m" && umount -l "$m"; } 2>/dev/null || true
done
# Where / is shared (systemd), the bind must not propagate back either.
mount --make-private "$(findmnt -no TARGET -T /usr/local/sbin)"
mount --bind "$bin" /usr/local/sbin
exec mount "$@"
`

// mount8 runs mount(8) with args, finding the shale under test, for
// mounts under dir (from sharedDir). It returns mount's exit code and
// output.
func mount8(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	sh := append([]string{"-m", "--propagation", "unchanged", "sh", "-c", mount8Script, "sh", dir, filepath.Dir(shaleBin)}, args...)
	return runCmd(t, exec.Command("unshare", sh...))
}

// servingPid8 finds the process serving mnt, started as mount.fuse3 does.
func servingPid8(t *testing.T, mnt string) int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", "shale .* "+regexp.QuoteMeta(mnt)+" -o ").Output()
	f := strings.Fields(string(out))
	if len(f) != 1 {
		t.Fatalf("want one process serving %s, found %q", mnt, out)
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// mountInfo returns the mount options and the file system's type and
// source of the mount at mnt, from the mountinfo of process proc
// ("/proc/self", "/proc/PID").
func mountInfo(t *testing.T, proc, mnt string) (opts []string, fstype, source string) {
	t.Helper()
	b, err := os.ReadFile(proc + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != mnt {
			continue
		}
		i := 6
		for f[i] != "-" {
			i++
		}
		return strings.Split(f[5], ","), f[i+1], f[i+2]
	}
	t.Fatalf("%s is not mounted", mnt)
	return nil, "", ""
}

func umount8(t *testing.T, mnts ...string) {
	t.Helper()
	if out, err := exec.Command("umount", mnts...).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v: %s", mnts, err, out)
	}
}

// dirs makes LOWER and MNT under dir.
func dirs(t *testing.T, dir, name string) (lower, mnt string) {
	t.Helper()
	lower, mnt = filepath.Join(dir, name+"-lower"), filepath.Join(dir, name+"-mnt")
	for _, d := range []string{lower, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return lower, mnt
}

// initCrypt makes lower a crypt directory with a passphrase file, and
// returns the file.
func initCrypt(t *testing.T, lower string) string {
	t.Helper()
	pass := filepath.Join(filepath.Dir(lower), filepath.Base(lower)+".pass")
	if err := os.WriteFile(pass, []byte("correct horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := run(t, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", lower); code != 0 {
		t.Fatalf("shale init: %s", out)
	}
	return pass
}

// roundTrip writes through mnt and reads back, and returns what the file
// holds in lower, if it is there under its own name.
func roundTrip(t *testing.T, lower, mnt string) []byte {
	t.Helper()
	want := []byte("written through mount(8)\n")
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %q, %v; want %q", got, err, want)
	}
	b, _ := os.ReadFile(filepath.Join(lower, "f"))
	return b
}

// TestMount8 mounts through mount(8), as an administrator does, with
// layers and their options given with -o.
func TestMount8(t *testing.T) {
	for _, c := range []struct {
		name string
		// opts returns the options for lower, having prepared it.
		opts func(t *testing.T, lower, mnt string) string
		// lowerF is what lower/f holds after roundTrip; "" for crypt,
		// where it is nowhere in the clear.
		lowerF string
	}{
		{"rot13", func(*testing.T, string, string) string { return "layer=rot13" }, "jevggra guebhtu zbhag(8)\n"},
		{"crypt", func(t *testing.T, lower, _ string) string {
			return "layer=crypt,passfile=" + initCrypt(t, lower)
		}, ""}, // names are encrypted
		{"stack file", func(t *testing.T, lower, mnt string) string {
			file := filepath.Join(filepath.Dir(lower), "stack.toml")
			toml := "lower = \"" + lower + "\"\n[[layer]]\nname = \"rot13\"\n[[view]]\nlayer = 1\nmountpoint = \"" + mnt + "\"\n"
			if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
				t.Fatal(err)
			}
			return "stack=" + file
		}, "jevggra guebhtu zbhag(8)\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := sharedDir(t)
			lower, mnt := dirs(t, dir, "v")
			if code, out := mount8(t, dir, "-t", "fuse.shale", lower, mnt, "-o", c.opts(t, lower, mnt)); code != 0 {
				t.Fatalf("mount: exit %d: %s", code, out)
			}
			if _, fstype, source := mountInfo(t, "/proc/self", mnt); fstype != "fuse.shale" || source != lower {
				t.Errorf("mounted %s from %s, want fuse.shale from %s", fstype, source, lower)
			}
			pid := servingPid8(t, mnt)
			if got := roundTrip(t, lower, mnt); string(got) != c.lowerF {
				t.Errorf("lower/f holds %q, want %q", got, c.lowerF)
			}
			if c.lowerF == "" {
				filepath.WalkDir(lower, func(p string, _ os.DirEntry, _ error) error {
					if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("through mount(8)")) {
						t.Errorf("%s holds the plaintext", p)
					}
					return nil
				})
			}
			umount8(t, mnt)
			waitGone(t, pid)
		})
	}
}

// TestMount8Errors: what mount(8) passes on that shale cannot do fails
// with one line, the reason and the remedy, and nothing is mounted.
func TestMount8Errors(t *testing.T) {
	dir := sharedDir(t)
	lower, mnt := dirs(t, dir, "v")
	pass := initCrypt(t, lower)
	for _, c := range []struct{ opts, want string }{
		{"layer=crypt,passfile=" + pass + ",colour=blue", `unknown mount option "colour=blue"`},
		{"layer=crypt", "add passfile=FILE"},
		{"layer=crypt,passfile=" + pass + ",sync", "sync is not supported"},
		{"layer=crypt,passfile=" + pass + ",debug", "needs log=FILE"},
	} {
		code, out := mount8(t, dir, "-t", "fuse.shale", lower, mnt, "-o", c.opts)
		wantOneLineError(t, code, out, c.want)
		if _, _, ok := mountedAt(mnt); ok {
			t.Fatalf("-o %s: mounted", c.opts)
		}
	}
}

// TestMountOptionErrors: shale LOWER MNT -o, as mount.fuse3 runs it, and
// shale mount -o refuse what they cannot do in one line, mounting nothing.
func TestMountOptionErrors(t *testing.T) {
	dir := t.TempDir()
	lower, mnt := dirs(t, dir, "v")
	other, _ := dirs(t, dir, "other")
	file := filepath.Join(dir, "stack.toml")
	os.WriteFile(file, []byte("lower = \""+other+"\"\n[[view]]\nlayer = 0\nmountpoint = \""+mnt+"\"\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{lower, mnt, "-o", "rw,nosuid,foo"}, `unknown mount option "foo"`},
		{[]string{"mount", "-o", "foo", lower, mnt}, `unknown mount option "foo"`},
		{[]string{lower, mnt, "-o", "ro=1"}, "takes no value"},
		{[]string{lower, mnt, "-o", "layer"}, "layer=NAME"},
		{[]string{lower, mnt, "-o", "layer=nope"}, `unknown layer "nope"`},
		{[]string{lower, mnt, "-o", "timeout=soon"}, "timeout=soon"},
		{[]string{lower, mnt, "-o", "remount,ro"}, "unmount and mount again"},
		{[]string{lower, mnt, "-o", "stack=" + file}, "not " + lower},
		{[]string{lower, "/dev/fd/3", "-o", "rw"}, "drop_privileges"},
	} {
		code, out := run(t, c.args...)
		wantOneLineError(t, code, out, c.want)
		if _, _, ok := mountedAt(mnt); ok {
			t.Fatalf("%q: mounted", c.args)
		}
	}
	// The list of what is accepted has every layer's options.
	_, out := run(t, lower, mnt, "-o", "foo")
	for _, k := range stack.Kinds() {
		for o := range k.Options {
			if !strings.Contains(out, o+"=") {
				t.Errorf("unknown-option error does not list %s of layer %s: %s", o, k.Name, out)
			}
		}
	}
	// Without -o, arguments are a mistyped command, as before.
	code, out := run(t, "umont", mnt)
	wantOneLineError(t, code, out, "did you mean")
	if !strings.Contains(out, "umount") {
		t.Errorf("%q suggests no umount", out)
	}
}

// TestLayerOptionsHaveFlags: -o gives a layer's options as the flags of
// the same name, so a layer option without one cannot be given there.
func TestLayerOptionsHaveFlags(t *testing.T) {
	m, _, err := rootCmd.Find([]string{"mount"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range stack.Kinds() {
		for o := range k.Options {
			if m.Flags().Lookup(strings.ReplaceAll(o, "_", "-")) == nil {
				t.Errorf("layer %s takes %s, which shale mount has no flag for", k.Name, o)
			}
		}
	}
}

// TestFstab mounts from an fstab, by mountpoint and with mount -a, as at
// boot, and again with mount -a, which leaves mounted lines alone.
func TestFstab(t *testing.T) {
	dir := sharedDir(t)
	lower1, mnt1 := dirs(t, dir, "rot13")
	lower2, mnt2 := dirs(t, dir, "crypt")
	pass := initCrypt(t, lower2)
	fstab := filepath.Join(dir, "fstab")
	lines := "# shale's test\n" +
		lower1 + " " + mnt1 + " fuse.shale layer=rot13,nofail 0 0\n" +
		lower2 + " " + mnt2 + " fuse.shale layer=crypt,passfile=" + pass + ",nosuid,nodev,nofail,x-systemd.requires-mounts-for=" + lower2 + ",comment=x 0 0\n"
	if err := os.WriteFile(fstab, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := mount8(t, dir, "-T", fstab, mnt1); code != 0 {
		t.Fatalf("mount %s: exit %d: %s", mnt1, code, out)
	}
	for i := 0; i < 2; i++ {
		if code, out := mount8(t, dir, "-T", fstab, "-a", "-t", "fuse.shale"); code != 0 {
			t.Fatalf("mount -a (%d): exit %d: %s", i+1, code, out)
		}
	}
	pid1, pid2 := servingPid8(t, mnt1), servingPid8(t, mnt2)
	if got := roundTrip(t, lower1, mnt1); string(got) != "jevggra guebhtu zbhag(8)\n" {
		t.Errorf("rot13: lower/f holds %q", got)
	}
	roundTrip(t, lower2, mnt2)
	// mount.fuse3 passes dev,suid unless a line says nodev,nosuid. They
	// are checked where mount(8) ran (see TestMount8ReadOnly).
	opts1, _, _ := mountInfo(t, "/proc/"+strconv.Itoa(pid1), mnt1)
	opts2, _, _ := mountInfo(t, "/proc/"+strconv.Itoa(pid2), mnt2)
	if strings.Contains(strings.Join(opts1, ","), "nosuid") || !strings.Contains(strings.Join(opts2, ","), "nosuid,nodev") {
		t.Errorf("mount options %s (default), %s (nosuid,nodev)", opts1, opts2)
	}
	umount8(t, mnt1, mnt2)
	waitGone(t, pid1)
	waitGone(t, pid2)
}

// TestMount8ReadOnly: ro and noexec are the mount's: writes fail with
// EROFS, programs do not run, reads work.
func TestMount8ReadOnly(t *testing.T) {
	dir := sharedDir(t)
	lower, mnt := dirs(t, dir, "v")
	os.WriteFile(filepath.Join(lower, "prog"), []byte("#!/bin/sh\nexit 0\n"), 0o755)
	if code, out := mount8(t, dir, "-t", "fuse.shale", "-r", lower, mnt, "-o", "noexec"); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	pid := servingPid8(t, mnt)
	// Checked where mount(8) ran, through the serving process's view of
	// its mount namespace: shale sets the flags by a remount there, which
	// does not propagate to this one (vfsFlags.apply).
	proc := "/proc/" + strconv.Itoa(pid)
	if opts, _, _ := mountInfo(t, proc, mnt); opts[0] != "ro" || !strings.Contains(strings.Join(opts, ","), "noexec") {
		t.Errorf("mount options %s, want ro and noexec", opts)
	}
	there := proc + "/root" + mnt
	if b, err := os.ReadFile(filepath.Join(there, "prog")); err != nil || !strings.HasPrefix(string(b), "#!") {
		t.Errorf("read: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(there, "prog"), nil, 0o755); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write: %v, want EROFS", err)
	}
	if err := os.Mkdir(filepath.Join(there, "d"), 0o755); !errors.Is(err, syscall.EROFS) {
		t.Errorf("mkdir: %v, want EROFS", err)
	}
	if err := exec.Command(filepath.Join(there, "prog")).Run(); !errors.Is(err, syscall.EACCES) {
		t.Errorf("running a program: %v, want EACCES", err)
	}
	umount8(t, mnt)
	waitGone(t, pid)
}

// TestSdNotify: shale mount -f under systemd (Type=notify) says READY=1
// once mounted and STOPPING=1 when it ends; in the background, where the
// unit's main process is gone, it says nothing.
func TestSdNotify(t *testing.T) {
	for _, c := range []struct {
		name       string
		abstract   bool // the socket in the abstract namespace ("@...")
		foreground bool
	}{{"socket path", false, true}, {"abstract socket", true, true}, {"background", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			lower, mnt := dirs(t, dir, "v")
			addr := filepath.Join(dir, "notify")
			if c.abstract {
				addr = "@shale-test-" + strconv.Itoa(os.Getpid())
			}
			sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer sock.Close()
			args := []string{"mount", lower, mnt}
			if c.foreground {
				args = []string{"mount", "-f", lower, mnt}
			}
			cmd := exec.Command(shaleBin, args...)
			cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+addr)
			if !c.foreground {
				if code, out := runCmd(t, cmd); code != 0 {
					t.Fatalf("shale mount: %s", out)
				}
				pid := servingPid(t, mnt)
				umount8(t, mnt)
				waitGone(t, pid)
				// Whatever it sent is queued by now: look without waiting.
				raw, err := sock.SyscallConn()
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 4096)
				var n int
				raw.Read(func(fd uintptr) bool {
					n, _, err = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
					return true
				})
				if !errors.Is(err, unix.EAGAIN) {
					t.Errorf("a background mount told systemd %q (%v)", buf[:max(n, 0)], err)
				}
				return
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var waitErr error
			exited := make(chan struct{})
			go func() {
				waitErr = cmd.Wait()
				close(exited)
			}()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
				if _, _, ok := mountedAt(mnt); ok {
					unix.Unmount(mnt, unix.MNT_DETACH)
				}
			})
			// A hang guard, far beyond what a busy machine needs.
			sock.SetReadDeadline(time.Now().Add(time.Minute))
			msg, err := readNotify(sock)
			if err != nil {
				t.Fatalf("no READY=1: %v", err)
			}
			if _, _, ok := mountedAt(mnt); !ok || msg != "READY=1\nSTATUS=serving "+lower+" at "+mnt {
				t.Fatalf("told %q, mounted %v; want READY=1 and a STATUS once mounted", msg, ok)
			}
			cmd.Process.Signal(syscall.SIGTERM)
			if msg, err = readNotify(sock); err != nil || !strings.HasPrefix(msg, "STOPPING=1\nSTATUS=") {
				t.Fatalf("told %q (%v), want STOPPING=1 and a STATUS", msg, err)
			}
			select {
			case <-exited:
				if waitErr != nil {
					t.Errorf("shale mount -f: %v", waitErr)
				}
			case <-time.After(time.Minute):
				t.Fatal("shale mount -f still running a minute after SIGTERM")
			}
			if _, _, ok := mountedAt(mnt); ok {
				t.Errorf("%s still mounted", mnt)
			}
		})
	}
}

// readNotify reads one sd_notify message.
func readNotify(sock *net.UnixConn) (string, error) {
	buf := make([]byte, 4096)
	n, err := sock.Read(buf)
	return string(buf[:n]), err
}
