// Package stress runs a bounded stress run on real shale mounts: fio in
// verify mode and stress-ng's file system stressors, each on a fresh loop
// view of a directory on a disk file system. Any error, verify mismatch,
// skipped stressor or non-zero exit fails the test.
//
// Work is bounded by operation counts (fio's sizes, stress-ng's
// --<stressor>-ops), never by wall time, so a slow machine makes a run
// longer, not different. Each run has a generous hang guard; its expiry
// is reported as a hang, with the state of the tool's processes, never as
// a failure of the file system.
//
// It needs fio and stress-ng (scripts/setup.sh installs them) and a working
// /dev/fuse; it runs best as root (allow_other, chown stressor).
package stress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
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

	"github.com/shalefs/shale/internal/shaletest"
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
	if shaleBin, err = shaletest.Build(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "stress:", err)
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

// A view is what a stress run mounts: shale mount's flags, and a step
// that readies the fresh lower directory first and gives more flags.
// Layers that transform data store other bytes below (transforms).
type view struct {
	flags      []string
	prepare    func(t *testing.T, base, lower string) []string
	transforms bool
	fioSize    string // each fio job's --size, if not the job's own
}

// loopView is the plain loop view; the layers' views follow.
var (
	loopView = view{}
	// The layers spend CPU on every byte: 32 MiB per job still crosses
	// thousands of their blocks, within the suite's time.
	compressView = view{flags: []string{"--layer", "compress"}, transforms: true, fioSize: "32m"}
	cryptView    = view{prepare: initCrypt, transforms: true, fioSize: "32m"}
)

// initCrypt makes lower a crypt directory (a cheap key derivation) and
// gives the flags that mount it.
func initCrypt(t *testing.T, base, lower string) []string {
	pass := filepath.Join(base, "pass")
	if err := os.WriteFile(pass, []byte("stress\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, base, hangGuard(t, time.Minute), shaleBin, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", lower); r.err != nil {
		r.fatal(t, "shale init")
	}
	return []string{"--layer", "crypt", "--passfile", pass}
}

// mountShale mounts v over a fresh lower directory and registers a robust
// unmount: shale umount, then umount -l if that fails.
func mountShale(t *testing.T, v view, prepareLower ...func(t *testing.T, lower string)) mount {
	t.Helper()
	base := diskDir(t)
	m := mount{lower: filepath.Join(base, "lower"), mnt: filepath.Join(base, "mnt")}
	for _, d := range []string{m.lower, m.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range prepareLower {
		p(t, m.lower)
	}
	args := append([]string{"mount"}, v.flags...)
	if v.prepare != nil {
		args = append(args, v.prepare(t, base, m.lower)...)
	}
	args = append(args, m.lower, m.mnt)
	if r := runTool(t, base, hangGuard(t, time.Minute), shaleBin, args...); r.err != nil {
		r.fatal(t, "shale "+strings.Join(args, " "))
	}
	t.Cleanup(func() { unmount(t, m.mnt) })
	if fstype := fsTypeAt(m.mnt); fstype != "fuse.shale" {
		t.Fatalf("after shale mount, %s is %q, want fuse.shale", m.mnt, fstype)
	}
	return m
}

func unmount(t *testing.T, mnt string) {
	r := runTool(t, "/", hangGuard(t, time.Minute), shaleBin, "umount", mnt)
	if r.err == nil && fsTypeAt(mnt) == "" {
		return
	}
	r.report(t, "shale umount "+mnt)
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

// A toolRun is the outcome of runTool.
type toolRun struct {
	out   string
	err   error
	guard time.Duration
	hung  bool   // the hang guard ended the run
	procs string // the tool's processes then, with state and wait channel
}

// runTool runs a tool in its own process group. guard is a hang guard,
// not a time budget: callers bound the tool's work by operation counts.
// When it expires, the group's processes are recorded (a process in state
// D waiting in fuse points at the mount, one in state R at a starved
// machine) and killed.
func runTool(t *testing.T, dir string, guard time.Duration, name string, args ...string) toolRun {
	t.Helper()
	r := toolRun{guard: guard}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		r.hung, r.procs = true, groupProcs(cmd.Process.Pid)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	r.err = cmd.Run()
	r.out = out.String()
	if r.hung && r.err == nil {
		r.err = errors.New("killed by the hang guard")
	}
	return r
}

// report fails t with what went wrong in the run: a hang, or the tool's
// own failure and output.
func (r toolRun) report(t *testing.T, what string) {
	t.Helper()
	if r.hung {
		t.Errorf("hang: %s did not finish within its %v hang guard. This is not a time budget: "+
			"the work is bounded by operation counts, so a slow machine only makes it longer. "+
			"Its processes when the guard expired (pid, command, state, wait channel):\n%s\noutput so far:\n%s",
			what, r.guard, r.procs, r.out)
		return
	}
	t.Errorf("%s: %v\n%s", what, r.err, r.out)
}

func (r toolRun) fatal(t *testing.T, what string) {
	t.Helper()
	r.report(t, what)
	t.FailNow()
}

// hangGuard returns limit, or less if the test binary's deadline (go test
// -timeout) comes sooner: a guard that expires is reported as a hang,
// where the binary's own timeout would only panic.
func hangGuard(t *testing.T, limit time.Duration) time.Duration {
	d, ok := t.Deadline()
	if !ok {
		return limit
	}
	return max(min(limit, time.Until(d)-30*time.Second), 10*time.Second)
}

// groupProcs lists the processes of process group pgid: pid, command,
// state and the kernel function it waits in.
func groupProcs(pgid int) string {
	var b strings.Builder
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		st, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		i := bytes.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		pid := filepath.Base(filepath.Dir(p))
		comm := string(st[bytes.IndexByte(st, '(')+1 : i])
		wchan, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "wchan"))
		fmt.Fprintf(&b, "  %s %s %s %s\n", pid, comm, f[0], wchan)
	}
	return b.String()
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

// fioJobs are the verify workloads, bounded by size (--size per job, one
// pass): each finishes in seconds on an idle disk.
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

// toolGuard is the hang guard of one fio job or stress-ng group, some ten
// times what each takes on a loaded machine.
const toolGuard = 5 * time.Minute

func testFio(t *testing.T, v view) {
	requireTool(t, "fio")
	m := mountShale(t, v)
	state := t.TempDir() // fio writes its verify state files to the cwd
	for _, j := range fioJobs {
		t.Run(j.name, func(t *testing.T) {
			dir := filepath.Join(m.mnt, j.name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			// No --runtime: fio would stop writing when it expires and
			// verify less on a slower machine.
			args := append([]string{"--name=" + j.name, "--directory=" + dir,
				"--do_verify=1", "--verify_fatal=1", "--verify_dump=0",
				"--group_reporting"}, j.args...)
			if v.fioSize != "" {
				args = append(args, "--size="+v.fioSize) // fio takes the last
			}
			r := runTool(t, state, hangGuard(t, toolGuard), "fio", args...)
			if r.hung {
				r.fatal(t, "fio "+j.name)
			}
			checkFio(t, j.name, r.out, r.err)
			alive(t, m)
			if !v.transforms {
				sameContent(t, m, j.name)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Errorf("removing %s through the mount: %v", dir, err)
			}
		})
	}
}

// TestFioVerify writes and verifies data through the mount with file data
// in FUSE passthrough (the default where the kernel offers it).
func TestFioVerify(t *testing.T) { testFio(t, loopView) }

// TestFioVerifyNoPassthrough does the same with file data served by shale.
func TestFioVerifyNoPassthrough(t *testing.T) {
	testFio(t, view{flags: []string{"--no-passthrough"}})
}

// The layers that transform data, whose read-modify-write of blocks,
// headers and indexes fio's patterns (random, mmap, direct, async) cross.
func TestFioVerifyCrypt(t *testing.T)    { testFio(t, cryptView) }
func TestFioVerifyCompress(t *testing.T) { testFio(t, compressView) }

// A stressor is a stress-ng stressor and the bogo operations it must
// complete, about ten seconds' worth on an idle 2-core machine.
type stressor struct {
	name string
	ops  int
}

// Stressors meaningful on a FUSE loop view, in two groups so that two
// cores are not swamped. Left out: fiemap (FUSE has no FIEMAP, stress-ng
// skips it), inode-flags (FS_IOC_GETFLAGS ioctls), chattr, verity,
// dnotify/fanotify/inotify (not file system operations of ours), and
// fpunch, whose parent process sleeps for the whole --timeout whatever
// --fpunch-ops says (stress-ng 0.15), so it cannot be bounded by
// operations; the fallocate stressor punches holes too (PUNCH_HOLE,
// ZERO_RANGE, COLLAPSE_RANGE, INSERT_RANGE), as does the conformance
// suite's fallocate case.
var stressGroups = []struct {
	name      string
	stressors []stressor
}{
	{"data", []stressor{{"hdd", 4000}, {"mmap", 2}, {"seek", 600}, {"readahead", 2000},
		{"revio", 10000}, {"aio", 10000}, {"iomix", 8000}, {"fallocate", 60},
		{"sync-file", 50}, {"copy-file", 240}, {"fsize", 120}, {"xattr", 16}, {"lease", 800}}},
	// link, symlink and chdir count one operation per 8192 links or
	// directories made and removed. No getdent: it reads /proc, /dev,
	// /tmp, /sys and /run, never --temp-path, so it tests the machine,
	// not shale, and hangs on any other hung FUSE mount under /tmp.
	{"metadata", []stressor{{"dir", 1000}, {"dirmany", 1600},
		{"dentry", 1400}, {"rename", 800}, {"link", 1}, {"symlink", 1}, {"mknod", 700},
		{"chmod", 100}, {"chown", 400}, {"utime", 1200}, {"touch", 2600}, {"open", 3000},
		{"fstat", 5000}, {"access", 300}, {"filename", 120},
		{"fcntl", 600}, {"flock", 36000}, {"lockf", 7000}, {"locka", 16000},
		{"lockofd", 15000}, {"chdir", 1}}},
	// dirdeep alone, on a file system of its own (ownFS): it stops making
	// directories once the free inodes fell by more than it may use since
	// it started, an unsigned difference that wraps when another program
	// frees inodes meanwhile (as the other stressors and tests on the
	// same disk do), and then does none of its operations.
	{"dirdeep", []stressor{{"dirdeep", 400}}},
}

// ownFS are the groups whose LOWER is a tmpfs of its own.
var ownFS = map[string]bool{"dirdeep": true}

// tmpfsLower mounts a tmpfs of its own on lower, for the test's time.
func tmpfsLower(t *testing.T, lower string) {
	if err := unix.Mount("tmpfs", lower, "tmpfs", 0, "size=256m,mode=0755"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", lower, err)
	}
	t.Cleanup(func() { unix.Unmount(lower, unix.MNT_DETACH) })
}

var (
	// stressBadRe: messages at the fail, error and warn levels, and
	// words stress-ng prints at the info level for a stressor that did
	// not run as asked ("skipping stressor", "finished prematurely",
	// "terminated with unexpected signal").
	stressBadRe    = regexp.MustCompile(`(?i)stress-ng: (fail|error|warn):|\b(fail|failed|error|errors|skipping|skipped|untrustworthy|aborted|killed|terminated|prematurely)\b`)
	stressMetricRe = regexp.MustCompile(`metrc: \[\d+\]\s+(\S+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+`)
)

// TestStressNG runs stress-ng's file system stressors on the mount, each
// until it has done its operations.
func TestStressNG(t *testing.T) {
	requireTool(t, "stress-ng")
	if os.Geteuid() != 0 {
		t.Fatalf("the chown stressor needs root; run the stress test as root")
	}
	for _, g := range stressGroups {
		t.Run(g.name, func(t *testing.T) {
			var prep []func(*testing.T, string)
			if ownFS[g.name] {
				prep = append(prep, tmpfsLower)
			}
			m := mountShale(t, loopView, prep...)
			// No --timeout: stress-ng's default (a day) leaves the
			// stressors to end on their operation counts; an expiring
			// timeout would cut them short on a slow machine (the
			// readahead stressor then reports "expired during test
			// setup" and no work).
			args := []string{"--temp-path", m.mnt, "--metrics-brief", "--verify"}
			for _, s := range g.stressors {
				args = append(args, "--"+s.name, "1", fmt.Sprintf("--%s-ops", s.name), strconv.Itoa(s.ops))
			}
			// The open stressor otherwise opens files until it hits its
			// descriptor limit, and the daemon, holding one descriptor per
			// open file, hits the same limit: that starves every FUSE
			// file system alike and says nothing about shale.
			args = append(args, "--open-max", "2000")
			r := runTool(t, m.mnt, hangGuard(t, toolGuard), "stress-ng", args...)
			if r.hung {
				r.fatal(t, "stress-ng "+g.name)
			}
			bad := r.err != nil
			if r.err != nil {
				t.Errorf("stress-ng %s: %v", g.name, r.err)
			}
			done := map[string]int{}
			for _, line := range strings.Split(r.out, "\n") {
				if mm := stressMetricRe.FindStringSubmatch(line); mm != nil {
					t.Logf("%s", strings.TrimSpace(line))
					done[mm[1]], _ = strconv.Atoi(mm[2])
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
				switch n, ok := done[s.name]; {
				case !ok:
					bad = true
					t.Errorf("stressor %s is missing from the metrics", s.name)
				case n < s.ops:
					bad = true
					t.Errorf("stressor %s did only %d of its %d operations", s.name, n, s.ops)
				}
			}
			if bad {
				t.Logf("full stress-ng output:\n%s", r.out)
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
	m := mountShale(t, loopView)
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
	guard := hangGuard(t, toolGuard)
	deadline := time.Now().Add(guard)
	for i := 0; i < n; i++ {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%06d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			t.Fatalf("creating file %d of %d through the mount (none kept open): %v; the serving process holds %d descriptors (limit %d)", i+1, n, err, len(fds), limit)
		}
		f.Close()
		if time.Now().After(deadline) {
			t.Fatalf("hang: created only %d of %d files within the %v hang guard (not a time budget: on a slow machine the files only take longer)", i+1, n, guard)
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
