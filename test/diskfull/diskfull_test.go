// Package diskfull fills small file systems through every stack of shale
// the conformance suite mounts, and a native tmpfs of the same size beside
// them, and checks what a full disk must do: the write fails with the
// lower file system's errno (ENOSPC; EFBIG past RLIMIT_FSIZE), the size
// never passes the bytes the writes acknowledged, and every acknowledged
// byte reads back, after fsync and after a remount too; deleting the file
// gives the room back.
//
// It needs root and /dev/fuse (it mounts tmpfs and shale); without them it
// fails. Every loop is bounded by the bytes it may write, not by time.
package diskfull

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

// fsSize is the size of every file system: small, so that filling one
// takes a few thousand writes.
const fsSize = 8 << 20

// pattern is what the tests write: byte i of a file is pattern[i].
var pattern = func() []byte {
	b := make([]byte, fsSize+4<<20)
	rand.NewChaCha8([32]byte{9, 2}).Read(b)
	return b
}()

var (
	setupErr error  // why the tests cannot run
	base     string // their temporary directory
	shaleBin string
)

// A target is a file system the tests fill: shale with layers, or native.
type target struct {
	name    string
	layers  []string // --layer arguments, bottom-most first; nil: the loop view
	native  bool
	prepare func(lower string) ([]string, error) // readies lower, returns mount arguments
	// sized layers store a file's blocks whole, with overhead: growing a
	// file whose last block is short needs room where a native file system
	// makes a hole.
	sized bool

	fs     string // the tmpfs; fs/lower is the lower directory
	dir    string // where the tests make files: the view, or fs/lower natively
	args   []string
	server int // a pidfd of the serving process
}

// targets are native tmpfs and the stacks of test/conformance.
var targets = []*target{
	{name: "native", native: true},
	{name: "loop"},
	{name: "rot13", layers: []string{"rot13"}},
	{name: "rot13-rot13", layers: []string{"rot13", "rot13"}},
	{name: "crypt", layers: []string{"crypt"}, prepare: initCrypt, sized: true},
	{name: "rot13-crypt", layers: []string{"rot13", "crypt"}, prepare: initCrypt, sized: true},
	{name: "shard", layers: []string{"shard"}, prepare: markShard},
	{name: "shard-rot13", layers: []string{"shard", "rot13"}, prepare: markShard},
}

// initCrypt keeps the passphrase off the small file system it fills.
func initCrypt(lower string) ([]string, error) {
	return shaletest.InitCrypt(shaleBin, lower, filepath.Join(filepath.Dir(filepath.Dir(lower)), "pass"))
}

// markShard makes the lower root a managed directory (setuid bit).
func markShard(lower string) ([]string, error) {
	return nil, os.Chmod(lower, 0o755|os.ModeSetuid)
}

const helperEnv = "SHALE_DISKFULL_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper(os.Args[1:]))
	}
	setupErr = setup()
	code := m.Run()
	if base != "" {
		os.RemoveAll(base)
	}
	os.Exit(code)
}

func setup() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (euid %d): the tests mount tmpfs and shale", os.Geteuid())
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cannot open /dev/fuse: %v", err)
	}
	unix.Close(fd)
	if base, err = os.MkdirTemp("", "shale-diskfull-"); err != nil {
		return err
	}
	shaleBin, err = shaletest.Build(base)
	return err
}

func TestDiskFull(t *testing.T) {
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	fills := []struct {
		name   string
		chunk  int
		append bool
	}{
		{"write-4KiB", 4 << 10, false},
		{"write-1MiB", 1 << 20, false},
		{"append-3000", 3000, true},
		{"append-1MiB+100", 1<<20 + 100, true},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			tg.setUp(t)
			for _, f := range fills {
				t.Run(f.name, func(t *testing.T) { fill(t, tg, f.chunk, f.append) })
			}
			t.Run("holes", func(t *testing.T) { holes(t, tg) })
			for _, chunk := range []int{4 << 10, 1 << 20} {
				t.Run(fmt.Sprintf("rlimit-fsize-%d", chunk), func(t *testing.T) { fsizeLimit(t, tg, chunk) })
			}
		})
	}
}

// setUp mounts the target's tmpfs and, for shale, the view over it; the
// test's cleanup unmounts them.
func (tg *target) setUp(t *testing.T) {
	root := filepath.Join(base, tg.name)
	tg.fs = filepath.Join(root, "fs")
	lower := filepath.Join(tg.fs, "lower")
	if err := os.MkdirAll(tg.fs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", tg.fs, "tmpfs", 0, "size="+strconv.Itoa(fsSize)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(tg.fs, 0); err != nil {
			t.Errorf("unmount %s: %v; detaching it", tg.fs, err)
			unix.Unmount(tg.fs, unix.MNT_DETACH)
		}
	})
	if err := os.Mkdir(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	if tg.native {
		tg.dir = lower
		return
	}
	tg.dir = filepath.Join(root, "mnt")
	if err := os.MkdirAll(tg.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tg.args = []string{"mount"}
	for _, l := range tg.layers {
		tg.args = append(tg.args, "--layer", l)
	}
	if tg.prepare != nil {
		extra, err := tg.prepare(lower)
		if err != nil {
			t.Fatal(err)
		}
		tg.args = append(tg.args, extra...)
	}
	tg.args = append(tg.args, lower, tg.dir)
	tg.mount(t)
	t.Cleanup(func() { tg.unmount(t) })
}

func (tg *target) mount(t *testing.T) {
	if out, err := exec.Command(shaleBin, tg.args...).CombinedOutput(); err != nil {
		t.Fatalf("shale %s: %v\n%s", strings.Join(tg.args, " "), err, out)
	}
	pid, err := serverOf(tg.args)
	if err == nil {
		tg.server, err = unix.PidfdOpen(pid, 0)
	}
	if err != nil {
		tg.unmount(t)
		t.Fatalf("the serving process of %s: %v", tg.dir, err)
	}
}

// serverOf finds the serving process shale mount started in the
// background: it has the same arguments.
func serverOf(args []string) (int, error) {
	want := "\x00" + strings.Join(args, "\x00") + "\x00"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if i := bytes.IndexByte(cmdline, 0); err == nil && i >= 0 && string(cmdline[i:]) == want {
			return pid, nil
		}
	}
	return 0, errors.New("not found in /proc")
}

// unmount ends the view and waits for its serving process to exit: until
// then it may hold lower files open, and their room is not free. It
// reports whether shale umount worked.
func (tg *target) unmount(t *testing.T) bool {
	out, err := exec.Command(shaleBin, "umount", tg.dir).CombinedOutput()
	if err != nil {
		t.Errorf("shale umount %s: %v: %s; detaching it", tg.dir, err, out)
		unix.Unmount(tg.dir, unix.MNT_DETACH)
	}
	if tg.server > 0 {
		unix.Poll([]unix.PollFd{{Fd: int32(tg.server), Events: unix.POLLIN}}, -1)
		unix.Close(tg.server)
		tg.server = 0
	}
	return err == nil
}

// remount mounts the view again, so that what follows reads what is
// stored, not what the serving process or the kernel kept, and so that no
// file closed or deleted before is still held open.
func (tg *target) remount(t *testing.T) {
	if tg.native {
		return
	}
	if !tg.unmount(t) {
		t.FailNow()
	}
	tg.mount(t)
}

var errNeverFailed = errors.New("no write failed before the end of the pattern")

// writeUntilError writes pattern from off on, chunk bytes a call, until a
// write fails, and returns the bytes acknowledged (short writes count) and
// the error. write puts p at file offset at.
func writeUntilError(write func(p []byte, at int) (int, error), off, chunk int) (int, error) {
	ack := 0
	for off+ack+chunk <= len(pattern) {
		k, err := write(pattern[off+ack:off+ack+chunk], off+ack)
		if err != nil {
			return ack, err
		}
		if k == 0 {
			return ack, errors.New("a write stored nothing and reported no error")
		}
		ack += k
	}
	return ack, errNeverFailed
}

// checkFile fails t unless path holds exactly want.
func checkFile(t *testing.T, what, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: reading %s: %v", what, filepath.Base(path), err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %s holds %d bytes, want %d", what, filepath.Base(path), len(got), len(want))
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %s differs from what was written at byte %d", what, filepath.Base(path), i)
	}
}

// checkSize fails t unless the open file fd is size bytes long.
func checkSize(t *testing.T, what string, fd int, size int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != int64(size) {
		t.Errorf("%s: st_size %d, want %d (the bytes acknowledged)", what, st.Size, size)
	}
}

func expectErr(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

func bavail(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail
}

// fill writes a file until the file system is full, as dd does, with
// writes of chunk bytes, then checks the errno, the size and the content,
// deletes the file and writes again.
func fill(t *testing.T, tg *target, chunk int, appendMode bool) {
	tg.remount(t)
	free := bavail(t, tg.dir)
	path := filepath.Join(tg.dir, "fill")
	flags := unix.O_CREAT | unix.O_WRONLY | unix.O_TRUNC
	if appendMode {
		flags |= unix.O_APPEND
	}
	fd, err := unix.Open(path, flags, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	ack, err := writeUntilError(func(p []byte, _ int) (int, error) { return unix.Write(fd, p) }, 0, chunk)
	expectErr(t, fmt.Sprintf("write after %d bytes", ack), err, unix.ENOSPC)
	if ack < fsSize*3/4 {
		t.Errorf("only %d bytes written before %v on a %d-byte file system", ack, err, fsSize)
	}
	checkSize(t, "after the failed write", fd, ack)
	if err := unix.Fsync(fd); err != nil {
		t.Errorf("fsync: %v", err)
	}
	checkSize(t, "after fsync", fd, ack)
	if err := unix.Close(fd); err != nil {
		t.Errorf("close: %v", err)
	}
	checkFile(t, "after fsync", path, pattern[:ack])
	tg.remount(t)
	checkFile(t, "after remount", path, pattern[:ack])
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	tg.remount(t)
	if got := bavail(t, tg.dir); got != free {
		t.Errorf("after deleting the file %d blocks free, before writing it %d", got, free)
	}
	if err := os.WriteFile(path, pattern[:1<<20], 0o644); err != nil {
		t.Fatalf("writing again after the delete: %v", err)
	}
	checkFile(t, "written again", path, pattern[:1<<20])
}

// holes grows files through holes, and fills a hole, with no room or
// one page of room left (taken by a file beside the lower directory).
func holes(t *testing.T, tg *target) {
	tg.remount(t)
	free := bavail(t, tg.dir)
	small, sparse := filepath.Join(tg.dir, "small"), filepath.Join(tg.dir, "sparse")
	filler := filepath.Join(tg.fs, "filler")
	for _, p := range []string{small, sparse, filler} {
		defer os.Remove(p)
	}
	const sparseSize, hole = 1 << 20, 256 << 10
	if err := os.WriteFile(small, pattern[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, sparseSize); err != nil {
		t.Fatal(err)
	}
	ff, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	// Page-sized writes until one fails leave no page free.
	_, err = writeUntilError(func(p []byte, at int) (int, error) { return ff.WriteAt(p, int64(at)) }, 0, 4096)
	expectErr(t, "filling the file system", err, unix.ENOSPC)
	fi, err := ff.Stat()
	ff.Close()
	if err != nil {
		t.Fatal(err)
	}

	fd, err := unix.Open(small, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = unix.Pwrite(fd, pattern[sparseSize:sparseSize+4096], sparseSize)
	expectErr(t, "write past a hole with no room", err, unix.ENOSPC)
	expectErr(t, "fallocate with no room", unix.Fallocate(fd, 0, 0, sparseSize), unix.ENOSPC)
	checkSize(t, "after the failed write and fallocate", fd, 100)
	err = unix.Ftruncate(fd, sparseSize)
	if tg.sized {
		expectErr(t, "ftruncate up with no room (the short last block must be stored whole)", err, unix.ENOSPC)
		checkSize(t, "after the failed ftruncate", fd, 100)
	} else if err != nil {
		t.Errorf("ftruncate up with no room: %v, want success (a hole)", err)
	} else {
		checkFile(t, "after ftruncate up", small, append(pattern[:100:100], make([]byte, sparseSize-100)...))
		if err := unix.Ftruncate(fd, 100); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(fd)
	checkFile(t, "after growing it failed", small, pattern[:100])

	// One page of room: a write into the hole stores at most that much.
	if err := os.Truncate(filler, fi.Size()-4096); err != nil {
		t.Fatal(err)
	}
	fd, err = unix.Open(sparse, unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := writeUntilError(func(p []byte, at int) (int, error) { return unix.Pwrite(fd, p, int64(at)) }, hole, 1<<20)
	expectErr(t, fmt.Sprintf("write into a hole after %d bytes", ack), err, unix.ENOSPC)
	if ack > 4096 {
		t.Errorf("%d bytes written into a hole with one page of room", ack)
	}
	checkSize(t, "after filling the hole failed", fd, sparseSize)
	unix.Close(fd)
	filled := make([]byte, sparseSize)
	copy(filled[hole:], pattern[hole:hole+ack])
	checkFile(t, "after filling the hole failed", sparse, filled)

	tg.remount(t)
	checkFile(t, "after remount", small, pattern[:100])
	checkFile(t, "after remount", sparse, filled)
	for _, p := range []string{small, sparse, filler} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	tg.remount(t)
	if got := bavail(t, tg.dir); got != free {
		t.Errorf("after deleting the files %d blocks free, before %d", got, free)
	}
}

// fsizeLimit runs the helper under RLIMIT_FSIZE: its writes stop at the
// limit with EFBIG (SIGXFSZ ignored), as its ftruncate past it does.
func fsizeLimit(t *testing.T, tg *target, chunk int) {
	const limit = 1<<20 + 1000
	path := filepath.Join(tg.dir, "limited")
	defer os.Remove(path)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, path, strconv.Itoa(limit), strconv.Itoa(chunk))
	// A race-enabled helper would otherwise sleep a second at exit.
	cmd.Env = append(os.Environ(), helperEnv+"=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("ack=%d write=EFBIG ftruncate=EFBIG", limit); got != want {
		t.Errorf("under RLIMIT_FSIZE %d: %s, want %s", limit, got, want)
	}
	checkFile(t, "after EFBIG", path, pattern[:limit])
}

// helper runs in a child process, as the test binary with the arguments
// PATH LIMIT CHUNK: it sets RLIMIT_FSIZE, which would hold for the whole
// test binary, then writes PATH past it.
func helper(args []string) int {
	if len(args) != 3 {
		fmt.Println("helper: want PATH LIMIT CHUNK")
		return 2
	}
	path := args[0]
	limit, err1 := strconv.ParseUint(args[1], 10, 64)
	chunk, err2 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2); err != nil {
		fmt.Println(err)
		return 2
	}
	signal.Ignore(syscall.SIGXFSZ)
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		fmt.Println(err)
		return 2
	}
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC, 0o644)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	defer unix.Close(fd)
	ack, werr := writeUntilError(func(p []byte, _ int) (int, error) { return unix.Write(fd, p) }, 0, chunk)
	terr := unix.Ftruncate(fd, int64(limit)+5000)
	fmt.Printf("ack=%d write=%s ftruncate=%s\n", ack, errName(werr), errName(terr))
	return 0
}

func errName(err error) string {
	var e syscall.Errno
	switch {
	case err == nil:
		return "OK"
	case errors.As(err, &e) && unix.ErrnoName(e) != "":
		return unix.ErrnoName(e)
	}
	return err.Error()
}
