package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// lastLine is the last line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return lines[len(lines)-1] + "\n"
}

// wantExit checks that a failure is one line saying substr, with exit
// status code.
func wantExit(t *testing.T, code int, out string, want int, substr string) {
	t.Helper()
	wantOneLineError(t, code, out, substr)
	if code != want {
		t.Errorf("exit %d, want %d (%q)", code, want, out)
	}
}

// TestExitCodes: each class of failure has its own exit status
// (exit.go, docs/admin.md), in the foreground and from a background
// mount alike.
func TestExitCodes(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	code, out := run(t, "mount", "--colour", lower, mnt)
	wantExit(t, code, out, exitUsage, "--colour")
	code, out = run(t, "mount", lower, mnt, "extra")
	wantExit(t, code, out, exitUsage, "arg")
	code, out = run(t, "mountt", lower, mnt)
	wantExit(t, code, out, exitUsage, "did you mean mount")
	code, out = run(t, "mount", "-o", "colour=blue", lower, mnt)
	wantExit(t, code, out, exitUsage, "colour")
	code, out = run(t, "mount", filepath.Join(dir, "nope"), mnt)
	wantExit(t, code, out, exitLower, "does not exist")
	code, out = run(t, "mount", lower, filepath.Join(dir, "nope"))
	wantExit(t, code, out, exitMountpoint, "does not exist")

	pass := filepath.Join(dir, "pass")
	os.WriteFile(pass, []byte("right\n"), 0o600)
	if code, out := run(t, "init", "--layer", "crypt", "--passfile", pass, lower); code != 0 {
		t.Fatalf("init: %s", out)
	}
	os.WriteFile(pass, []byte("wrong\n"), 0o600)
	for _, fg := range []string{"--foreground=false", "-f"} {
		code, out = run(t, "mount", fg, "--layer", "crypt", "--passfile", pass, lower, mnt)
		wantExit(t, code, out, exitPassphrase, "wrong passphrase")
	}
}

// TestNonemptyMountpoint: a mountpoint with files is refused, as it would
// hide them, unless --nonempty (-o nonempty) says so.
func TestNonemptyMountpoint(t *testing.T) {
	_, lower, mnt := lowerAndMnt(t)
	os.WriteFile(filepath.Join(lower, "lower-file"), nil, 0o644)
	os.WriteFile(filepath.Join(mnt, "hidden"), nil, 0o644)
	code, out := run(t, "mount", lower, mnt)
	wantExit(t, code, out, exitMountpoint, "not empty")
	if _, _, ok := mountedAt(mnt); ok {
		t.Fatal("mounted over a non-empty mountpoint")
	}
	for _, args := range [][]string{{"mount", "--nonempty", lower, mnt}, {lower, mnt, "-o", "nonempty"}} {
		if code, out := run(t, args...); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, out)
		}
		if _, err := os.Stat(filepath.Join(mnt, "lower-file")); err != nil {
			t.Errorf("%q: %v", args, err)
		}
		if code, out := run(t, "umount", mnt); code != 0 {
			t.Fatalf("umount: %s", out)
		}
	}
}

// TestFusermountReason: where fusermount3 refuses a user's mount, its
// reason, and what to do, are in the one error line (go-fuse says only
// "fusermount exited with code 256"), in the background and with -f.
// The mount namespace gives a /dev/fuse nobody may open or, in the
// second case, one open to all, and an /etc/fuse.conf without
// user_allow_other.
func TestFusermountReason(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	lower, mnt := filepath.Join(dir, "lower"), filepath.Join(dir, "mnt")
	os.Mkdir(lower, 0o755)
	os.Mkdir(mnt, 0o755)
	os.Chown(mnt, 65534, 65534)
	conf := filepath.Join(dir, "fuse.conf")
	os.WriteFile(conf, []byte("# no user_allow_other\n"), 0o644)
	for _, c := range []struct {
		mode, flag, want string
	}{
		{"600", "", "failed to open /dev/fuse: Permission denied: uid 65534 may not open /dev/fuse"},
		{"666", "--allow-other", "user_allow_other' is set in /etc/fuse.conf: add a line user_allow_other"},
	} {
		for _, fg := range []string{"--foreground=false", "-f"} {
			args := []string{"mount", fg, lower, mnt}
			if c.flag != "" {
				args = append(args, c.flag)
			}
			cmd := exec.Command("unshare", append([]string{"-m", "sh", "-c", `mount --make-rprivate / &&
				mknod -m "$0" "$1/fuse" c 10 229 && mount --bind "$1/fuse" /dev/fuse &&
				mount --bind "$1/fuse.conf" /etc/fuse.conf && shift &&
				exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"`, c.mode, dir, shaleBin}, args...)...)
			code, out := runCmd(t, cmd)
			if fg == "-f" {
				out = lastLine(out) // after the log, on stderr with -f
			}
			wantExit(t, code, out, exitMount, c.want)
			os.Remove(filepath.Join(dir, "fuse"))
			if _, _, ok := mountedAt(mnt); ok {
				syscall.Unmount(mnt, syscall.MNT_DETACH)
				t.Fatalf("%q mounted", args)
			}
		}
	}
}

// TestExitCodesDocumented: docs/admin.md's table has a row for each exit
// status of exit.go, and no other.
func TestExitCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/admin.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(b), "| status | what failed |")
	table, _, _ = strings.Cut(table, "\n\n")
	var rows []string
	for _, line := range strings.Split(table, "\n")[2:] {
		rows = append(rows, strings.TrimSpace(strings.Split(line, "|")[1]))
	}
	want := []string{"0"}
	for _, c := range []int{exitFailure, exitUsage, exitLower, exitMountpoint, exitMount, exitPassphrase} {
		want = append(want, strconv.Itoa(c))
	}
	if strings.Join(rows, " ") != strings.Join(want, " ") {
		t.Errorf("docs/admin.md lists exit statuses %q, exit.go has %q", rows, want)
	}
}
