// Package stress runs a bounded stress run on real shale mounts: fio in
// verify mode and stress-ng's file system stressors, each on a fresh loop
// view of a directory on a disk file system. Any error, verify mismatch,
// skipped stressor or non-zero exit fails the test.
//
// It needs fio and stress-ng (scripts/setup.sh installs them) and a working
// /dev/fuse; it runs best as root (allow_other, chown stressor).
package stress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shaleBin is the shale binary built by TestMain.
var shaleBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "shale-stress-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(bytes.TrimSpace(gomod)) == 0 || string(bytes.TrimSpace(gomod)) == os.DevNull {
		fmt.Fprintf(os.Stderr, "stress: cannot find the module root (go env GOMOD): %v\n", err)
		return 1
	}
	shaleBin = filepath.Join(tmp, "shale")
	build := exec.Command("go", "build", "-o", shaleBin, "github.com/shalefs/shale/cmd/shale")
	build.Dir = filepath.Dir(string(bytes.TrimSpace(gomod)))
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "stress: building shale: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// requireTool fails (never skips) the test when a tool is missing.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run scripts/setup.sh (it installs fio and stress-ng)", name)
	}
	return p
}

// diskDir returns a fresh directory on a disk file system: t.TempDir()
// unless that is on tmpfs, then one under /var/tmp.
func diskDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(d, &st); err == nil && st.Type != unix.TMPFS_MAGIC {
		return d
	}
	d, err := os.MkdirTemp("/var/tmp", "shale-stress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := unix.Statfs(d, &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		t.Fatalf("no disk file system for the lower directory: %s is tmpfs; set TMPDIR to a directory on disk", d)
	}
	return d
}

type mount struct {
	lower, mnt string
}

// mountShale mounts a fresh lower directory and registers a robust
// unmount: shale umount, then umount -l if that fails.
func mountShale(t *testing.T, extra ...string) mount {
	t.Helper()
	base := diskDir(t)
	m := mount{lower: filepath.Join(base, "lower"), mnt: filepath.Join(base, "mnt")}
	for _, d := range []string{m.lower, m.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"mount"}, extra...)
	args = append(args, m.lower, m.mnt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, shaleBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("shale %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Cleanup(func() { unmount(t, m.mnt) })
	if fstype := fsTypeAt(m.mnt); fstype != "fuse.shale" {
		t.Fatalf("after shale mount, %s is %q, want fuse.shale", m.mnt, fstype)
	}
	return m
}

func unmount(t *testing.T, mnt string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, shaleBin, "umount", mnt).CombinedOutput()
	if err == nil && fsTypeAt(mnt) == "" {
		return
	}
	t.Errorf("shale umount %s: %v\n%s", mnt, err, out)
	if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
		t.Errorf("umount -l %s: %v\n%s", mnt, err, out)
	}
}

// fsTypeAt returns the file system type mounted at dir, or "".
func fsTypeAt(dir string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	fstype := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != dir {
			continue
		}
		for i, w := range f {
			if w == "-" && i+1 < len(f) {
				fstype = f[i+1]
			}
		}
	}
	return fstype
}

// alive fails the test if the mount stopped answering.
func alive(t *testing.T, m mount) {
	t.Helper()
	if fstype := fsTypeAt(m.mnt); fstype != "fuse.shale" {
		t.Fatalf("mount %s is gone (now %q)", m.mnt, fstype)
	}
	if _, err := os.ReadDir(m.mnt); err != nil {
		t.Fatalf("mount %s does not answer: %v", m.mnt, err)
	}
}

// runTool runs a tool with a hard deadline and returns its combined output.
func runTool(t *testing.T, dir string, limit time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("killed after %v (limit %v): %w", time.Since(start).Round(time.Second), limit, err)
	}
	return out.String(), err
}

var (
	fioErrRe  = regexp.MustCompile(`\berr=\s*(\d+)`)
	fioBadRe  = regexp.MustCompile(`(?i)verify|fail|error|bad magic|mismatch|corrupt`)
	fioSumRe  = regexp.MustCompile(`^\s*(READ|WRITE):`)
	fioJobsRe = regexp.MustCompile(`^\S+: \(groupid=`)
)

// checkFio fails t on a non-zero exit, a non-zero err= or any line that
// speaks of verify failures or errors, and logs the summary lines.
func checkFio(t *testing.T, what, out string, err error) {
	t.Helper()
	bad := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case fioJobsRe.MatchString(line):
			t.Logf("%s: %s", what, strings.TrimSpace(line))
			if mm := fioErrRe.FindStringSubmatch(line); mm == nil || mm[1] != "0" {
				bad = true
				t.Errorf("%s: job reports an error: %s", what, line)
			}
		case fioSumRe.MatchString(line):
			t.Logf("%s: %s", what, strings.TrimSpace(line))
		case fioBadRe.MatchString(line) && !strings.Contains(line, "verify_"):
			// Job headers ("verify: (g=0): rw=...") and the summary carry
			// no error words; anything else that does is a failure.
			if strings.Contains(line, "(g=") {
				continue
			}
			bad = true
			t.Errorf("%s: %s", what, strings.TrimSpace(line))
		}
	}
	if err != nil {
		bad = true
		t.Errorf("%s: fio: %v", what, err)
	}
	if bad {
		t.Logf("%s: full fio output:\n%s", what, out)
	}
}

// sameContent checks that every regular file in the mount reads the same
// through the mount as directly from the lower directory.
func sameContent(t *testing.T, m mount, sub string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(m.lower, sub), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(m.lower, p)
		a, errA := fileSum(p)
		b, errB := fileSum(filepath.Join(m.mnt, rel))
		switch {
		case errA != nil || errB != nil:
			t.Errorf("%s: lower: %v, mount: %v", rel, errA, errB)
		case a != b:
			t.Errorf("%s: content differs between lower (%x) and mount (%x)", rel, a[:8], b[:8])
		}
		n++
		return nil
	})
	if err != nil {
		t.Errorf("walking %s: %v", m.lower, err)
	}
	if n == 0 {
		t.Errorf("no files under %s to compare", filepath.Join(m.lower, sub))
	}
}

func fileSum(p string) ([32]byte, error) {
	var sum [32]byte
	f, err := os.Open(p)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// fioJobs are the verify workloads; each finishes in seconds on a disk,
// and each is bounded by fioLimit.
var fioJobs = []struct {
	name string
	args []string
}{
	{"randrw-4k", []string{"--rw=randrw", "--bs=4k", "--size=128m", "--numjobs=2", "--ioengine=psync", "--verify=crc32c"}},
	{"seq-1m", []string{"--rw=write", "--bs=1m", "--size=512m", "--numjobs=1", "--ioengine=psync", "--verify=crc32c", "--end_fsync=1"}},
	{"randwrite-direct-16k", []string{"--rw=randwrite", "--bs=16k", "--size=128m", "--numjobs=2", "--ioengine=psync", "--direct=1", "--verify=md5"}},
	{"randrw-mmap-8k", []string{"--rw=randrw", "--bs=8k", "--size=64m", "--numjobs=2", "--ioengine=mmap", "--verify=crc32c"}},
	{"randwrite-libaio-64k", []string{"--rw=randwrite", "--bs=64k", "--size=128m", "--numjobs=1", "--ioengine=libaio", "--iodepth=16", "--direct=1", "--verify=sha256"}},
}

const fioLimit = 60 * time.Second

func testFio(t *testing.T, mountFlags ...string) {
	requireTool(t, "fio")
	m := mountShale(t, mountFlags...)
	state := t.TempDir() // fio writes its verify state files to the cwd
	for _, j := range fioJobs {
		t.Run(j.name, func(t *testing.T) {
			dir := filepath.Join(m.mnt, j.name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--name=" + j.name, "--directory=" + dir,
				"--do_verify=1", "--verify_fatal=1", "--verify_dump=0",
				"--group_reporting", "--runtime=50"}, j.args...)
			out, err := runTool(t, state, fioLimit, "fio", args...)
			checkFio(t, j.name, out, err)
			alive(t, m)
			sameContent(t, m, j.name)
			if err := os.RemoveAll(dir); err != nil {
				t.Errorf("removing %s through the mount: %v", dir, err)
			}
		})
	}
}

// TestFioVerify writes and verifies data through the mount with file data
// in FUSE passthrough (the default where the kernel offers it).
func TestFioVerify(t *testing.T) { testFio(t) }

// TestFioVerifyNoPassthrough does the same with file data served by shale.
func TestFioVerifyNoPassthrough(t *testing.T) { testFio(t, "--no-passthrough") }

// Stressors meaningful on a FUSE loop view, in two groups so that two
// cores are not swamped. Left out: fiemap (FUSE has no FIEMAP, stress-ng
// skips it), inode-flags (FS_IOC_GETFLAGS ioctls), chattr, verity,
// dnotify/fanotify/inotify (not file system operations of ours).
var stressGroups = []struct {
	name      string
	stressors []string
}{
	{"data", []string{"hdd", "mmap", "seek", "readahead", "revio", "aio", "iomix",
		"fallocate", "fpunch", "sync-file", "copy-file", "fsize", "xattr", "lease"}},
	{"metadata", []string{"dir", "dirdeep", "dirmany", "dentry", "rename", "link",
		"symlink", "mknod", "chmod", "chown", "utime", "touch", "open", "fstat",
		"getdent", "access", "filename", "fcntl", "flock", "lockf", "locka",
		"lockofd", "chdir"}},
}

const stressTime = 20 * time.Second

var (
	stressBadRe    = regexp.MustCompile(`(?i)\b(fail|failed|error|errors|skipping|skipped|untrustworthy|aborted|killed)\b`)
	stressMetricRe = regexp.MustCompile(`metrc: \[\d+\]\s+(\S+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+`)
)

// TestStressNG runs stress-ng's file system stressors on the mount.
func TestStressNG(t *testing.T) {
	requireTool(t, "stress-ng")
	for _, g := range stressGroups {
		t.Run(g.name, func(t *testing.T) {
			m := mountShale(t)
			for _, s := range g.stressors {
				if s == "chown" && os.Geteuid() != 0 {
					t.Fatalf("the chown stressor needs root; run the stress test as root")
				}
			}
			args := []string{"--temp-path", m.mnt, "--timeout", fmt.Sprint(int(stressTime.Seconds())) + "s",
				"--metrics-brief", "--verify"}
			for _, s := range g.stressors {
				args = append(args, "--"+s, "1")
			}
			// The open stressor otherwise opens files until it hits its
			// descriptor limit, and the daemon, holding one descriptor per
			// open file, hits the same limit: that starves every FUSE
			// file system alike and says nothing about shale.
			args = append(args, "--open-max", "2000")
			out, err := runTool(t, m.mnt, stressTime+60*time.Second, "stress-ng", args...)
			bad := err != nil
			if err != nil {
				t.Errorf("stress-ng %s: %v", g.name, err)
			}
			ran := map[string]bool{}
			for _, line := range strings.Split(out, "\n") {
				if mm := stressMetricRe.FindStringSubmatch(line); mm != nil {
					t.Logf("%s", strings.TrimSpace(line))
					if mm[2] != "0" {
						ran[mm[1]] = true
					}
					continue
				}
				if strings.Contains(line, "successful run completed") {
					t.Logf("%s", strings.TrimSpace(line))
				}
				if stressBadRe.MatchString(line) {
					bad = true
					t.Errorf("stress-ng: %s", strings.TrimSpace(line))
				}
			}
			for _, s := range g.stressors {
				if !ran[s] {
					bad = true
					t.Errorf("stressor %s did no work (0 bogo ops or missing from the metrics)", s)
				}
			}
			if bad {
				t.Logf("full stress-ng output:\n%s", out)
			}
			alive(t, m)
			if ents, err := os.ReadDir(m.mnt); err == nil && len(ents) > 0 {
				names := []string{}
				for _, e := range ents {
					names = append(names, e.Name())
				}
				t.Logf("left in the mount after stress-ng: %v", names)
			}
		})
	}
}

// daemonPID returns the pid of the process serving the FUSE mount at mnt:
// the one holding /dev/fuse open with mnt on its command line.
func daemonPID(mnt string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(mnt)) {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(p, "fd"))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join(p, "fd", fd.Name())); l == "/dev/fuse" {
				pid, _ := strconv.Atoi(filepath.Base(p))
				return pid
			}
		}
	}
	return 0
}

// openFileLimit returns the soft RLIMIT_NOFILE of pid, or 0.
func openFileLimit(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && strings.HasPrefix(line, "Max open files") {
			n, _ := strconv.Atoi(f[3])
			return n
		}
	}
	return 0
}

// TestManyFiles creates more files through the mount than the serving
// process may hold descriptors, keeping none of them open. A file system
// must not fail with EMFILE here: nothing is open. (stress-ng's dentry,
// link, symlink, mknod and touch stressors run into the same limit.)
func TestManyFiles(t *testing.T) {
	m := mountShale(t)
	pid := daemonPID(m.mnt)
	limit := openFileLimit(pid)
	n := limit + 5000
	if limit == 0 || limit > 100000 {
		n = 30000
		t.Logf("serving process %d may hold %d descriptors; creating %d files only, which exposes descriptor exhaustion only below that", pid, limit, n)
	} else {
		t.Logf("serving process %d may hold %d descriptors; creating %d files", pid, limit, n)
	}
	dir := filepath.Join(m.mnt, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; i++ {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%06d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			t.Fatalf("creating file %d of %d through the mount (none kept open): %v; the serving process holds %d descriptors (limit %d)", i+1, n, err, len(fds), limit)
		}
		f.Close()
		if time.Now().After(deadline) {
			t.Fatalf("created only %d of %d files in 60s", i+1, n)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != n {
		t.Fatalf("listing %s: %d entries, %v; want %d", dir, len(ents), err, n)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("removing %s: %v", dir, err)
	}
	alive(t, m)
}
