// Package conformance runs the same file system operations on the native
// file system and on a real shale mount, and checks that they agree.
//
// See README.md for what it covers and how to add a case.
package conformance

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

// dirPrefix names the base directories of this suite, so that a later run
// can clear the mounts of a run that was killed before its cleanup.
const dirPrefix = "shale-conformance-"

// suite is the state shared by all tests of the package.
var suite struct {
	setupErr error  // why the suite cannot run; reported by every test
	base     string // base directory, 0755
	native   string // native root: base/native, on the same file system as lower
	shale    string // the shale binary
	helper   string // copy of this test binary that uid 65534 can execute
	stacks   []*stack
}

// A stack is one shale mount the cases run on, beside native.
type stack struct {
	name    string
	layers  []string // --layer arguments, bottom-most first
	lower   string   // base/NAME/lower
	mnt     string   // base/NAME/mnt
	mounted bool
	// prepare, if set, readies the lower directory before the mount and
	// returns extra mount arguments.
	prepare func(lower string) ([]string, error)
	// server, if set, starts a 9P server of the lower directory and
	// returns the LOWER the mount names instead of it.
	server func(st *stack) (string, error)
	proc   *exec.Cmd // the server, stopped after the unmount
	// differs lists, as "case/observation", what this stack is documented
	// to do otherwise than native, with the reason; docs/conformance.md
	// repeats them.
	differs map[string]string
}

func (st *stack) differsIn(caseName string) map[string]string {
	m := map[string]string{}
	for _, d := range []map[string]string{fuseDiffers, st.differs} {
		for k, why := range d {
			if c, key, _ := strings.Cut(k, "/"); c == caseName {
				m[key] = why
			}
		}
	}
	return m
}

// fuseDiffers are differences of every FUSE file system, from the kernel's
// FUSE client.
var fuseDiffers = map[string]string{
	"locks-ofd/OFD lock b after close of a": "the kernel sends RELEASE, which drops an open file's OFD locks, after close(2) has returned; the check half a second later holds",
}

// stacks are the mounts every case runs on: the loop view, each layer, and
// layers stacked.
var stacks = []*stack{
	{name: "loop"},
	{name: "rot13", layers: []string{"rot13"}},
	{name: "rot13-rot13", layers: []string{"rot13", "rot13"}},
	{name: "crypt", layers: []string{"crypt"}, prepare: initCrypt, differs: cryptDiffers},
	{name: "rot13-crypt", layers: []string{"rot13", "crypt"}, prepare: initCrypt, differs: cryptDiffers},
	// shard with the lower root managed, so that every case's directory
	// is made in a managed directory.
	{name: "shard", layers: []string{"shard"}, prepare: markShard},
	{name: "shard-rot13", layers: []string{"shard", "rot13"}, prepare: markShard},
	// compress alone, and over crypt (compressed, then encrypted).
	{name: "compress", layers: []string{"compress"}, differs: compressDiffers},
	{name: "crypt-compress", layers: []string{"crypt", "compress"}, prepare: initCrypt, differs: cryptCompressDiffers},
	// Over 9P: shale's client of shale's server, with crypt on the client
	// over a plain export (the server sees only ciphertext), and of diod.
	// Root squash is off: the cases compare root's steps with native.
	{name: "9p", server: shaleServe, differs: ninepDiffers},
	{name: "9p-crypt", layers: []string{"crypt"}, prepare: initCrypt, server: shaleServe, differs: merge(cryptDiffers, ninepDiffers)},
	{name: "diod", server: diodServe, differs: merge(ninepDiffers, diodDiffers)},
}

// ninepDiffers are what every 9P mount does otherwise than native, for
// want of a message in 9P2000.L (docs/network.md).
var ninepDiffers = func() map[string]string {
	m := map[string]string{}
	add := func(why string, c string, keys ...string) {
		for _, k := range keys {
			m[c+"/"+k] = why
		}
	}
	add("9P2000.L has no fallocate: allocation fails with EOPNOTSUPP, and no lseek: the client reports data up to the size and one hole at the end",
		"fallocate", "KEEP_SIZE beyond EOF", "PUNCH_HOLE|KEEP_SIZE", "SEEK_DATA after hole", "SEEK_HOLE", "ZERO_RANGE",
		"after ZERO_RANGE", "allocate 8 KiB", "blocks", "blocks grew", "extend to 5 GiB", "punched range is zeros", "size", "size kept")
	add("9P2000.L has no fallocate (the case allocates to see bfree fall)", "statfs", "fallocate", "64 MiB allocated shows in bfree")
	add("9P2000.L has no lseek: the client reports data up to the size and one hole at the end",
		"sparse-5GiB", "SEEK_DATA 0", "SEEK_DATA after last data", "SEEK_HOLE 0", "SEEK_HOLE after data")
	add("9P2000.L's Trenameat has no flags: RENAME_EXCHANGE is EINVAL, as from Linux's own 9P client",
		"rename-exchange-file-dir", "rename a b", "tree")
	add("Tlock has no flock kind: flock is a whole-file POSIX lock on the server, as Linux's NFS client makes it: LOCK_EX needs a descriptor open for writing, and flock and fcntl locks conflict",
		"locks-flock", "POSIX lock beside flock", "a LOCK_EX", "after close", "b LOCK_EX, same process", "b LOCK_SH, same process",
		"b while the dup holds it", "c LOCK_EX", "dup of a LOCK_EX again", "other process", "upgrade after helper's unlock", "upgrade to LOCK_EX")
	add("F_GETLK over 9P reports pid 0: the holder's proc_id is a number of its client, which may be another machine",
		"locks-posix", "getlk for read sees the write lock only", "getlk sees helper's lock", "other process step 5", "other process step 8")
	add("F_GETLK over 9P reports pid 0 (and not -1 for an OFD lock, which FUSE does not tell apart either)",
		"locks-ofd", "other process sees an OFD lock")
	return m
}()

// diodDiffers are what diod itself does otherwise (diod 1.0.24).
var diodDiffers = func() map[string]string {
	m := map[string]string{}
	add := func(why string, c string, keys ...string) {
		for _, k := range keys {
			m[c+"/"+k] = why
		}
	}
	add("diod's locks are flock(2) of its own open file: byte ranges, lock owners and the release of a process's locks at any close are not kept",
		"locks-posix", "helper lock w", "nothing left", "other process step 3", "other process step 4", "released by closing another fd", "write lock conflicts")
	add("diod's fids are paths: once the name a file was reached by is unlinked, that file is gone for the client (other hard links, open files)",
		"nlink", "lstat g", "a file does not count", "after moving a subdir out: d", "after moving a subdir out: root", "after rmdir", "after unlink: g",
		"case root", "content via g", "dir with 3 subdirs", "empty dir", "hard-linked symlink", "link to a dir", "symlink", "tree")
	add("diod's fids are paths: an open file that is unlinked can no longer be read or changed",
		"open-unlinked", "pread", "close", "create in removed dir", "fchmod", "fsetxattr", "fstat", "fstat after fchmod, ftruncate", "ftruncate",
		"getdents on removed dir", "new file", "old content", "read after unlink", "removed dir nlink", "tree")
	add("diod's fids are paths: a file renamed over still answers for the name", "rename-open-file", "old b nlink")
	groups := "diod carries no gid nor supplementary groups: it takes the user's groups from its own user database (nobody is in no group there), so a caller's group that only the client gives it grants nothing, and a chmod or create that sets setgid in it loses the bit"
	add(groups, "perm-basic", "nobody+users read 0640 root:users")
	add(groups, "perm-groups", "member 5 stat: setgid kept", "member 20 stat: setgid kept", "tree")
	add("diod removes an xattr on any zero-size Txattrcreate: empty values cannot be set",
		"xattr", "get user.empty", "largest user.max value", "list", "list after", "list size query", "set user.empty")
	return m
}()

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// shaleServe starts shale serve of st's lower directory on a unix socket.
func shaleServe(st *stack) (string, error) {
	sock := filepath.Join(filepath.Dir(st.lower), "9p.sock")
	st.proc = exec.Command(suite.shale, "serve", "--no-root-squash", "--listen", "unix:"+sock, st.lower)
	return "9p://" + sock, startServer(st, sock)
}

// diodServe starts diod exporting st's lower directory on a unix socket;
// diod's attach name is the exported path.
func diodServe(st *stack) (string, error) {
	sock := filepath.Join(filepath.Dir(st.lower), "9p.sock")
	st.proc = exec.Command("diod", "-f", "-n", "-e", st.lower, "-l", sock, "-L", filepath.Join(filepath.Dir(st.lower), "diod.log"))
	return "9p://" + sock + "?aname=" + st.lower, startServer(st, sock)
}

// startServer starts st.proc and waits until it answers on sock.
func startServer(st *stack, sock string) error {
	st.proc.Stderr = os.Stderr
	if err := st.proc.Start(); err != nil {
		return fmt.Errorf("%s: starting %s: %v", st.name, st.proc.Path, err)
	}
	done := make(chan error, 1)
	go func() { done <- st.proc.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			go func() { <-done }()
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("%s: %s ended before it served: %v", st.name, st.proc.Path, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s did not listen on %s within 30s", st.name, st.proc.Path, sock)
}

// markShard marks lower managed for shard: the setuid bit (chmod u+s).
func markShard(lower string) ([]string, error) {
	return nil, os.Chmod(lower, 0o755|os.ModeSetuid)
}

// initCrypt makes lower a crypt directory with a cheap key derivation.
func initCrypt(lower string) ([]string, error) {
	return shaletest.InitCrypt(suite.shale, lower, filepath.Join(filepath.Dir(lower), "pass"))
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// A helper process (see helper_test.go): no mount, only the one
		// test that runs the helper's steps.
		os.Exit(m.Run())
	}
	unix.Umask(0o022)
	err := setup()
	if err != nil {
		suite.setupErr = err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "conformance: %v: unmounting\n", s)
		teardown()
		os.Exit(2)
	}()
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: cleanup: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// requireSuite fails t when the suite could not be set up. Root and
// /dev/fuse are required: CI runs as root, and a skipped conformance check
// would look like a passing one.
func requireSuite(t *testing.T) {
	t.Helper()
	if suite.setupErr != nil {
		t.Fatalf("conformance suite not set up: %v", suite.setupErr)
	}
}

func setup() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (euid is %d): the suite mounts shale and switches to uid 65534; run it with sudo, e.g. sudo -E go test ./test/conformance/", os.Geteuid())
	}
	if fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0); err != nil {
		return fmt.Errorf("cannot open /dev/fuse: %v (load the fuse module: modprobe fuse)", err)
	} else {
		unix.Close(fd)
	}
	clearStaleMounts()
	base, err := os.MkdirTemp("", dirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return err
	}
	suite.base = base
	suite.native = filepath.Join(base, "native")
	dirs := []string{suite.native, filepath.Join(base, "bin")}
	for _, st := range stacks {
		st.lower = filepath.Join(base, st.name, "lower")
		st.mnt = filepath.Join(base, st.name, "mnt")
		dirs = append(dirs, filepath.Join(base, st.name), st.lower, st.mnt)
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	suite.stacks = stacks
	// MkdirTemp makes 0700 directories; uid 65534 must reach the roots.
	if err := os.Chmod(base, 0o755); err != nil {
		return err
	}
	if suite.shale, err = shaletest.Build(filepath.Join(base, "bin")); err != nil {
		return err
	}
	if err := copyHelper(); err != nil {
		return err
	}
	for _, st := range suite.stacks {
		if err := st.mount(); err != nil {
			return err
		}
	}
	return nil
}

// copyHelper copies the test binary where uid 65534 can run it: go test
// keeps it in a 0700 directory.
func copyHelper() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	suite.helper = filepath.Join(suite.base, "bin", "conformance.test")
	out, err := os.OpenFile(suite.helper, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (st *stack) mount() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"mount"}
	for _, l := range st.layers {
		args = append(args, "--layer", l)
	}
	if st.prepare != nil {
		extra, err := st.prepare(st.lower)
		if err != nil {
			return fmt.Errorf("%s: preparing %s: %v", st.name, st.lower, err)
		}
		args = append(args, extra...)
	}
	lower := st.lower
	if st.server != nil {
		var err error
		if lower, err = st.server(st); err != nil {
			return err
		}
	}
	args = append(args, lower, st.mnt)
	out, err := exec.CommandContext(ctx, suite.shale, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("shale %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	st.mounted = true
	if _, fstype, ok := mountedAt(st.mnt); !ok || !strings.HasPrefix(fstype, "fuse") {
		return fmt.Errorf("shale mount returned, but %s is not a FUSE mount (%q)", st.mnt, fstype)
	}
	return nil
}

// teardown unmounts (with shale umount, retrying while busy, then umount
// -l as a last resort) and removes the base directory.
func teardown() error {
	if suite.base == "" {
		return nil
	}
	var errs []string
	mounted := false
	for _, st := range suite.stacks {
		if st.mounted {
			if err := unmount(st.mnt); err != nil {
				errs = append(errs, err.Error())
				mounted = true
			} else {
				st.mounted = false
			}
		}
		if st.proc != nil && st.proc.Process != nil {
			st.proc.Process.Signal(syscall.SIGTERM)
		}
	}
	if !mounted {
		if err := os.RemoveAll(suite.base); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if errs != nil {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func unmount(mnt string) error {
	var last []byte
	if suite.shale != "" {
		for i := 0; i < 10; i++ {
			out, err := exec.Command(suite.shale, "umount", mnt).CombinedOutput()
			if err == nil {
				return nil
			}
			last = out
			if _, _, ok := mountedAt(mnt); !ok {
				return nil
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("unmounting %s: shale umount: %s; umount -l: %v: %s", mnt, strings.TrimSpace(string(last)), err, out)
	}
	return fmt.Errorf("shale umount %s failed (%s); detached it with umount -l", mnt, strings.TrimSpace(string(last)))
}

// clearStaleMounts detaches the mounts of earlier runs of this suite whose
// process is gone (a run killed by a timeout has no chance to clean up).
func clearStaleMounts() {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	prefix := filepath.Join(os.TempDir(), dirPrefix)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || !strings.HasPrefix(fields[4], prefix) || filepath.Base(fields[4]) != "mnt" {
			continue
		}
		rest := strings.TrimPrefix(fields[4], prefix)
		pid, err := strconv.Atoi(rest[:strings.IndexAny(rest+"-", "-/")])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			continue // its run may still be going
		}
		unix.Unmount(fields[4], unix.MNT_DETACH)
		os.RemoveAll(filepath.Dir(fields[4]))
	}
}

// mountedAt reports whether dir is a mount point, and its type.
func mountedAt(dir string) (source, fstype string, ok bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 || fields[4] != dir {
			continue
		}
		for i, w := range fields {
			if w == "-" && i+2 < len(fields) {
				source, fstype, ok = fields[i+2], fields[i+1], true
			}
		}
	}
	return source, fstype, ok
}

// cryptDiffers are the documented limits of the crypt layer.
var cryptDiffers = func() map[string]string {
	m := map[string]string{}
	add := func(why string, keys ...string) {
		for _, k := range keys {
			m[k] = why
		}
	}
	add("crypt blocks carry 32 bytes of nonce and tag per 4 KiB, so st_blocks is larger; punching holes or zeroing ranges inside encrypted blocks is not supported, and holes are not reported",
		"fallocate/blocks", "fallocate/blocks grew", "fallocate/PUNCH_HOLE|KEEP_SIZE", "fallocate/blocks after punch",
		"fallocate/punched range is zeros", "fallocate/SEEK_HOLE", "fallocate/SEEK_DATA after hole",
		"fallocate/ZERO_RANGE", "fallocate/after ZERO_RANGE")
	add("crypt reports no holes: its 4128-byte stored blocks do not line up with the lower file system's",
		"sparse-5GiB/SEEK_DATA 0", "sparse-5GiB/SEEK_HOLE 0", "sparse-5GiB/SEEK_DATA after last data",
		"sparse-5GiB/SEEK_HOLE after data")
	add("crypt stores user.* and trusted.* attributes encrypted, bound to the file's identity (docs/crypt-format.md, Extended attributes): names of at most 159 bytes, values of at most 65508 (28 bytes of nonce and tag; the lower file system refuses more, E2BIG), and each takes more room below",
		"xattr/name of 255 bytes", "xattr/set 65536 bytes", "xattr/largest user.max value")
	return m
}()

// compressDiffers are what the compress layer does otherwise than native
// (docs/compress.md).
var compressDiffers = func() map[string]string {
	m := map[string]string{}
	add := func(why string, keys ...string) {
		for _, k := range keys {
			m[k] = why
		}
	}
	add("st_blocks is the stored (compressed) size, and a compressed file has no room to reserve: fallocate sets the size, it allocates nothing",
		"fallocate/blocks", "fallocate/blocks grew", "fallocate/blocks after punch", "statfs/64 MiB allocated shows in bfree")
	return m
}()

// cryptCompressDiffers: beneath compress, crypt's limits on extended
// attributes show through; its data differences do not (compress keeps
// holes and allocation its own way).
var cryptCompressDiffers = func() map[string]string {
	m := merge(compressDiffers)
	for k, why := range cryptDiffers {
		if strings.HasPrefix(k, "xattr/") {
			m[k] = why
		}
	}
	return m
}()
