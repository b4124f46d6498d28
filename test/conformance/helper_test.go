package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The helper process: this test binary run again, with -test.run naming
// TestHelperProcess and helperEnv holding a JSON list of steps. It runs
// the steps in order, printing one line per step: the errno name ("OK"
// when it worked), then any result. Cases use it to act as another user
// (uid 65534, nobody) and as another process (locks).
const helperEnv = "SHALE_CONFORMANCE_HELPER"

// cred is whom a helper runs as.
type cred struct {
	uid, gid uint32
	groups   []uint32
}

var (
	asRoot = (*cred)(nil)
	nobody = &cred{uid: 65534, gid: 65534}
)

// Nobody runs steps as uid/gid 65534 with no supplementary groups and
// returns one line per step.
func (e *env) Nobody(steps ...[]string) []string {
	e.t.Helper()
	return e.As(nobody, steps...)
}

// As runs steps in a helper process with credentials c (nil: root).
func (e *env) As(c *cred, steps ...[]string) []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := helperCmd(ctx, c, steps)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		e.t.Fatalf("%s: helper %v: %v\n%s%s", e.Name, steps, err, out, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(steps) {
		e.t.Fatalf("%s: helper %v printed %q", e.Name, steps, out)
	}
	return lines
}

// NoteAs runs steps as c and records each step's line under key.i.
func (e *env) NoteAs(key string, c *cred, steps ...[]string) []string {
	e.t.Helper()
	lines := e.As(c, steps...)
	for i, l := range lines {
		step := strings.ReplaceAll(strings.Join(steps[i], " "), e.Root, "ROOT")
		e.Note(fmt.Sprintf("%s[%d] %s", key, i, step), strings.ReplaceAll(l, e.Root, "ROOT"))
	}
	return lines
}

func helperCmd(ctx context.Context, c *cred, steps [][]string) *exec.Cmd {
	js, _ := json.Marshal(steps)
	cmd := exec.CommandContext(ctx, suite.helper, "-test.run=^TestHelperProcess$", "-test.count=1")
	// A race-enabled binary sleeps a second at exit unless told not to.
	cmd.Env = []string{helperEnv + "=" + string(js), "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}
	cmd.Dir = "/"
	if c != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.gid, Groups: c.groups}}
	}
	return cmd
}

// live is a running helper whose steps include "wait".
type live struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	cancel context.CancelFunc
}

// Start runs steps in a helper that keeps running: each "wait" step
// blocks until Next is called. Lines come back through Line.
func (e *env) Start(c *cred, steps ...[]string) *live {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cmd := helperCmd(ctx, c, steps)
	in, err := cmd.StdinPipe()
	e.Must(err, "helper stdin")
	out, err := cmd.StdoutPipe()
	e.Must(err, "helper stdout")
	cmd.Stderr = os.Stderr
	e.Must(cmd.Start(), "starting helper")
	l := &live{cmd: cmd, stdin: in, stdout: bufio.NewReader(out), cancel: cancel}
	e.t.Cleanup(func() { l.stdin.Close(); l.cmd.Wait(); l.cancel() })
	return l
}

// Line returns the helper's next line.
func (l *live) Line(e *env) string {
	e.t.Helper()
	s, err := l.stdout.ReadString('\n')
	if err != nil {
		e.t.Fatalf("%s: reading from helper: %v (got %q)", e.Name, err, s)
	}
	return strings.TrimSuffix(s, "\n")
}

// Next lets the helper go past one "wait" step.
func (l *live) Next() { io.WriteString(l.stdin, "\n") }

// Pid is the helper's process id.
func (l *live) Pid() int { return l.cmd.Process.Pid }

// Wait ends the helper (closing its stdin) and waits for it.
func (l *live) Wait(e *env) {
	e.t.Helper()
	l.stdin.Close()
	rest, _ := io.ReadAll(l.stdout)
	if err := l.cmd.Wait(); err != nil {
		e.t.Fatalf("%s: helper: %v (%q)", e.Name, err, rest)
	}
}

// TestHelperProcess is not a test: it is the helper process's body.
func TestHelperProcess(t *testing.T) {
	js := os.Getenv(helperEnv)
	if js == "" {
		return
	}
	var steps [][]string
	if err := json.Unmarshal([]byte(js), &steps); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(3)
	}
	fds := map[string]int{}
	stdin := bufio.NewReader(os.Stdin)
	for _, s := range steps {
		res, err := helperStep(s, fds, stdin)
		line := errName(err)
		if res != "" {
			line += " " + res
		}
		os.Stdout.WriteString(line + "\n")
	}
	os.Exit(0)
}

func num(s string) int64 {
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		panic(fmt.Sprintf("helper: bad number %q", s))
	}
	return n
}

var lockTypes = map[string]int16{"r": unix.F_RDLCK, "w": unix.F_WRLCK, "u": unix.F_UNLCK}

func lockTypeName(t int16) string {
	switch t {
	case unix.F_RDLCK:
		return "F_RDLCK"
	case unix.F_WRLCK:
		return "F_WRLCK"
	case unix.F_UNLCK:
		return "F_UNLCK"
	}
	return strconv.Itoa(int(t))
}

// helperStep runs one step. Paths are absolute; modes and numbers are Go
// literals (0o644, 0x10).
func helperStep(s []string, fds map[string]int, stdin *bufio.Reader) (string, error) {
	switch s[0] {
	case "read": // read PATH
		b, err := os.ReadFile(s[1])
		if err != nil {
			return "", err
		}
		return strconv.Quote(string(b)), nil
	case "open": // open NAME PATH FLAGS(r|w|rw|a) : keeps the fd as NAME
		fl := map[string]int{"r": unix.O_RDONLY, "w": unix.O_WRONLY, "rw": unix.O_RDWR, "a": unix.O_WRONLY | unix.O_APPEND}[s[3]]
		fd, err := unix.Open(s[2], fl|unix.O_CLOEXEC, 0)
		if err == nil {
			fds[s[1]] = fd
		}
		return "", err
	case "close": // close NAME
		return "", unix.Close(fds[s[1]])
	case "write": // write PATH DATA : open O_WRONLY (no create) and write
		fd, err := unix.Open(s[1], unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte(s[2]))
		return "", err
	case "create": // create PATH MODE : O_CREAT|O_EXCL
		fd, err := unix.Open(s[1], unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, uint32(num(s[2])))
		if err != nil {
			return "", err
		}
		return "", unix.Close(fd)
	case "mkdir":
		return "", unix.Mkdir(s[1], uint32(num(s[2])))
	case "mkfifo":
		return "", unix.Mkfifo(s[1], uint32(num(s[2])))
	case "umask": // umask MASK : for the steps after it
		unix.Umask(int(num(s[1])))
		return "", nil
	case "unlink":
		return "", unix.Unlink(s[1])
	case "rmdir":
		return "", unix.Rmdir(s[1])
	case "rename":
		return "", unix.Rename(s[1], s[2])
	case "chmod":
		return "", unix.Chmod(s[1], uint32(num(s[2])))
	case "chown":
		return "", unix.Lchown(s[1], int(num(s[2])), int(num(s[3])))
	case "utimes-now": // utimensat(PATH, NULL): needs write access or ownership
		return "", unix.UtimesNano(s[1], nil)
	case "truncate":
		return "", unix.Truncate(s[1], num(s[2]))
	case "setxattr":
		return "", unix.Setxattr(s[1], s[2], []byte(s[3]), 0)
	case "stat":
		var st unix.Stat_t
		if err := unix.Lstat(s[1], &st); err != nil {
			return "", err
		}
		return statString(&st), nil
	case "ls":
		f, err := os.Open(s[1])
		if err != nil {
			return "", err
		}
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return "", err
		}
		slices.Sort(names)
		return strings.Join(names, ","), nil
	case "access": // access PATH MODE(rwx letters)
		m := uint32(0)
		for _, c := range s[2] {
			m |= map[rune]uint32{'r': unix.R_OK, 'w': unix.W_OK, 'x': unix.X_OK}[c]
		}
		return "", unix.Faccessat(unix.AT_FDCWD, s[1], m, unix.AT_EACCESS)
	case "setlk": // setlk NAME TYPE(r|w|u) START LEN
		lk := unix.Flock_t{Type: lockTypes[s[2]], Whence: 0, Start: num(s[3]), Len: num(s[4])}
		return "", unix.FcntlFlock(uintptr(fds[s[1]]), unix.F_SETLK, &lk)
	case "getlk": // getlk NAME TYPE START LEN : prints type, pid, start, len
		lk := unix.Flock_t{Type: lockTypes[s[2]], Whence: 0, Start: num(s[3]), Len: num(s[4])}
		if err := unix.FcntlFlock(uintptr(fds[s[1]]), unix.F_GETLK, &lk); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s pid=%d start=%d len=%d", lockTypeName(lk.Type), lk.Pid, lk.Start, lk.Len), nil
	case "flock": // flock NAME ex|sh|un
		how := map[string]int{"ex": unix.LOCK_EX, "sh": unix.LOCK_SH, "un": unix.LOCK_UN}[s[2]]
		return "", unix.Flock(fds[s[1]], how|unix.LOCK_NB)
	case "pid":
		return strconv.Itoa(os.Getpid()), nil
	case "wait": // wait for a line on stdin
		_, err := stdin.ReadString('\n')
		if err == io.EOF {
			err = nil
		}
		return "", err
	}
	panic(fmt.Sprintf("helper: unknown step %q", s))
}
