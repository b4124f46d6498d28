package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var shaleBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Stderr.WriteString("cmd/shale tests mount file systems: run them as root\n")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "shale-cli")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755) // other users run it too
	shaleBin = filepath.Join(dir, "shale")
	build := exec.Command("go", "build", "-o", shaleBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs shale and returns its exit code and output.
func run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return runCmd(t, exec.Command(shaleBin, args...))
}

// runCmd runs cmd and returns its exit code and output.
func runCmd(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// lowerAndMnt makes a test directory with an empty lower directory and a
// mountpoint in it.
func lowerAndMnt(t *testing.T) (dir, lower, mnt string) {
	t.Helper()
	dir = t.TempDir()
	lower, mnt = filepath.Join(dir, "lower"), filepath.Join(dir, "mnt")
	for _, d := range []string{lower, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, lower, mnt
}

// mount mounts lower at mnt and arranges for it to end with the test.
func mount(t *testing.T, lower, mnt string) {
	t.Helper()
	if code, out := run(t, "mount", lower, mnt); code != 0 {
		t.Fatalf("shale mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() {
		if _, _, ok := mountedAt(mnt); ok {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
}

func wantOneLineError(t *testing.T, code int, out, substr string) {
	t.Helper()
	if code == 0 {
		t.Fatalf("exit 0, want failure; output %q", out)
	}
	if strings.Count(strings.TrimRight(out, "\n"), "\n") != 0 || !strings.HasPrefix(out, "shale: ") {
		t.Errorf("want one line starting with 'shale: ', got %q", out)
	}
	if !strings.Contains(out, substr) {
		t.Errorf("error %q does not mention %q", out, substr)
	}
}

func TestBadMountArguments(t *testing.T) {
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	mnt := filepath.Join(dir, "mnt")
	file := filepath.Join(dir, "file")
	os.Mkdir(lower, 0o755)
	os.Mkdir(mnt, 0o755)
	os.Mkdir(filepath.Join(lower, "inner"), 0o755)
	os.WriteFile(file, nil, 0o644)

	code, out := run(t, "mount", filepath.Join(dir, "nope"), mnt)
	wantOneLineError(t, code, out, "does not exist")
	code, out = run(t, "mount", file, mnt)
	wantOneLineError(t, code, out, "not a directory")
	code, out = run(t, "mount", lower, filepath.Join(dir, "nomnt"))
	wantOneLineError(t, code, out, "does not exist")
	code, out = run(t, "mount", lower, filepath.Join(lower, "inner"))
	wantOneLineError(t, code, out, "inside lower directory")
	code, out = run(t, "mount", lower, lower)
	wantOneLineError(t, code, out, "inside lower directory")
	code, out = run(t, "mount", lower)
	if code == 0 {
		t.Errorf("mount with one argument succeeded: %s", out)
	}
	code, out = run(t, "umount", mnt)
	wantOneLineError(t, code, out, "not a mount point")

	mount(t, lower, mnt)
	code, out = run(t, "mount", lower, mnt)
	wantOneLineError(t, code, out, "already a mount point")
}

func TestUnreadableLower(t *testing.T) {
	dir := t.TempDir()
	// nobody must reach dir: open up the per-test parent t.TempDir made.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	lower := filepath.Join(dir, "lower")
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(lower, 0o700)
	os.Mkdir(mnt, 0o777)
	cmd := exec.Command(shaleBin, "mount", lower, mnt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	code, out := runCmd(t, cmd)
	wantOneLineError(t, code, out, "not readable")
}

// Without /dev/fuse (a private /dev in a mount namespace) mount says so.
func TestNoDevFuse(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "lower"), 0o755)
	os.Mkdir(filepath.Join(dir, "mnt"), 0o755)
	cmd := exec.Command("unshare", "-m", "sh", "-c",
		`mount --make-rprivate / && mount -t tmpfs none /dev && exec "$0" mount "$1" "$2"`,
		shaleBin, filepath.Join(dir, "lower"), filepath.Join(dir, "mnt"))
	code, out := runCmd(t, cmd)
	wantOneLineError(t, code, out, "/dev/fuse")
}

// TestHelpExplainsFlags: mount --help is short, with the common flags
// and an example, and points to --help-all, which has every flag and the
// whole text, as the man page does.
func TestHelpExplainsFlags(t *testing.T) {
	code, out := run(t, "mount", "--help")
	if code != 0 {
		t.Fatalf("mount --help: exit %d", code)
	}
	for _, f := range []string{"--foreground", "--timeout", "--allow-other", "--layer", "--log", "--help-all", "\n  shale mount /srv/data /mnt/data\n"} {
		if !strings.Contains(out, f) {
			t.Errorf("mount --help does not explain %s", f)
		}
	}
	if n := strings.Count(out, "\n"); n > 40 {
		t.Errorf("mount --help is %d lines, want at most 40:\n%s", n, out)
	}
	short := out
	for _, args := range [][]string{{"mount", "--help-all"}, {"mount", "--help", "--help-all"}} {
		code, out := run(t, args...)
		for _, f := range []string{"--no-passthrough", "--write-delay", "--cache-dir", "--metrics", "--stack", "[[view]]", "Sprite's consistency rules"} {
			if code != 0 || !strings.Contains(out, f) {
				t.Errorf("%q: exit %d, does not explain %s", args, code, f)
			}
		}
		if len(out) < 2*len(short) {
			t.Errorf("%q is not the whole help:\n%s", args, out)
		}
	}
	if code, out := run(t, "--help"); code != 0 || !strings.Contains(out, "umount") {
		t.Errorf("--help: exit %d, output %q", code, out)
	}
}

// servingPid finds the background process serving mnt.
func servingPid(t *testing.T, mnt string) int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", "shale mount .* "+mnt+"$").Output()
	f := strings.Fields(string(out))
	if len(f) != 1 {
		t.Fatalf("want one process serving %s, found %q", mnt, out)
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	// A hang guard, far beyond what a busy machine needs.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return
		}
		// Reap it if it is our zombie (it is not: it was re-parented).
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if strings.Contains(string(b), ") Z ") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("serving process %d still running", pid)
}

func TestMountServesAndEnds(t *testing.T) {
	for _, how := range []string{"shale umount", "umount", "SIGTERM", "SIGINT"} {
		t.Run(how, func(t *testing.T) {
			_, lower, mnt := lowerAndMnt(t)
			os.WriteFile(filepath.Join(lower, "f"), []byte("through"), 0o644)
			mount(t, lower, mnt)
			if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "through" {
				t.Fatalf("read through the mount: %q %v", b, err)
			}
			pid := servingPid(t, mnt)
			switch how {
			case "shale umount":
				if code, out := run(t, "umount", mnt); code != 0 {
					t.Fatalf("shale umount: %s", out)
				}
			case "umount":
				if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
					t.Fatalf("umount: %s", out)
				}
			case "SIGTERM":
				syscall.Kill(pid, syscall.SIGTERM)
			case "SIGINT":
				syscall.Kill(pid, syscall.SIGINT)
			}
			waitGone(t, pid)
			if _, _, ok := mountedAt(mnt); ok {
				t.Errorf("%s still mounted after %s", mnt, how)
			}
		})
	}
}

func TestUmountBusy(t *testing.T) {
	_, lower, mnt := lowerAndMnt(t)
	mount(t, lower, mnt)
	f, err := os.Create(filepath.Join(mnt, "open"))
	if err != nil {
		t.Fatal(err)
	}
	code, out := run(t, "umount", mnt)
	wantOneLineError(t, code, out, "busy")
	f.Close()
	if code, out := run(t, "umount", mnt); code != 0 {
		t.Errorf("umount after close: %s", out)
	}
}

// TestUmountBusyStackView: each view of a stack ends on its own unmount,
// refused while busy as for a single mount, and the process ends with the
// last view. Two views of one layer share one FUSE mount (a bind mount).
func TestUmountBusyStackView(t *testing.T) {
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	os.Mkdir(lower, 0o755)
	var mnts []string
	stack := "lower = \"" + lower + "\"\n[[layer]]\nname = \"rot13\"\n"
	for i, l := range []string{"0", "0", "1"} {
		m := filepath.Join(dir, "view"+strconv.Itoa(i))
		os.Mkdir(m, 0o755)
		mnts = append(mnts, m)
		stack += "[[view]]\nlayer = " + l + "\nmountpoint = \"" + m + "\"\n"
	}
	toml := filepath.Join(dir, "stack.toml")
	os.WriteFile(toml, []byte(stack), 0o644)
	if code, out := run(t, "mount", "--stack", toml); code != 0 {
		t.Fatalf("shale mount --stack: exit %d: %s", code, out)
	}
	t.Cleanup(func() {
		for _, m := range mnts {
			if _, _, ok := mountedAt(m); ok {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	})
	out, _ := exec.Command("pgrep", "-f", "shale mount --stack "+toml).Output()
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("want one process serving %s, found %q", toml, out)
	}
	f, err := os.Create(filepath.Join(mnts[1], "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The idle view of the shared mount goes; the busy one refuses.
	if code, out := run(t, "umount", mnts[0]); code != 0 {
		t.Fatalf("umount of an idle view: %s", out)
	}
	code, msg := run(t, "umount", mnts[1])
	wantOneLineError(t, code, msg, "busy")
	for _, m := range mnts[1:] {
		if _, _, ok := mountedAt(m); !ok {
			t.Fatalf("%s unmounted after unmounting others", m)
		}
	}
	if _, err := f.WriteString("still served"); err != nil {
		t.Errorf("write through the busy view: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(mnts[2], "open")); err != nil || string(b) != "fgvyy freirq" {
		t.Errorf("read through rot13: %q %v", b, err)
	}
	f.Close()
	for _, m := range mnts[1:] {
		if code, out := run(t, "umount", m); code != 0 {
			t.Errorf("umount %s: %s", m, out)
		}
	}
	waitGone(t, pid)
}

func TestBadStackFiles(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	for _, c := range []struct{ toml, want string }{
		{"lower = \"" + lower + "\"\n", "at least one [[view]] or [[export]]"},
		{"lower = \"" + lower + "\"\ncolour = 1\n[[view]]\nlayer = 0\nmountpoint = \"" + mnt + "\"\n", "unknown key"},
		{"lower = \"" + lower + "\"\n[[view]]\nlayer = 1\nmountpoint = \"" + mnt + "\"\n", "layer = 0"},
		{"lower = \"" + lower + "\"\n[[layer]]\nname = \"nope\"\n[[view]]\nlayer = 1\nmountpoint = \"" + mnt + "\"\n", "unknown layer"},
		{"lower = \"" + lower + "\"\n[[view]]\nlayer = 0\nmountpoint = \"" + lower + "/x\"\n", "does not exist"},
		{"lower = [\n", "stack file"},
	} {
		f := filepath.Join(dir, "stack.toml")
		os.WriteFile(f, []byte(c.toml), 0o644)
		code, out := run(t, "mount", "--stack", f)
		wantOneLineError(t, code, out, c.want)
	}
	code, out := run(t, "mount", "--stack", filepath.Join(dir, "missing.toml"))
	wantOneLineError(t, code, out, "missing.toml")
}

// TestKilledWhileMounting: kill -9 of the serving process at the moment
// its mount appears must not leave a process or a mount that hangs: the
// server never makes a request to its own mount, whose reply it would
// wait for forever.
func TestKilledWhileMounting(t *testing.T) {
	_, lower, mnt := lowerAndMnt(t)
	for i := 0; i < 20; i++ {
		cmd := exec.Command(shaleBin, "mount", "-f", lower, mnt)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		// A hang guard only: the mount appears at once on any machine.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			if _, _, ok := mountedAt(mnt); ok {
				break
			}
			select {
			case <-exited:
				t.Fatalf("round %d: shale mount -f ended before mounting", i)
			default:
			}
		}
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			abortFuse(mnt)
			t.Fatalf("round %d: the serving process hangs after kill -9", i)
		}
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Fatalf("round %d: detaching the dead mount: %v", i, err)
		}
	}
}

// abortFuse ends the FUSE connection of mnt, so that a hung test can clean
// up.
func abortFuse(mnt string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == mnt {
			_, minor, _ := strings.Cut(f[2], ":")
			os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0)
		}
	}
}
