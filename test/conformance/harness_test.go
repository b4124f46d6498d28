package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// A conformance case runs the same steps in env.Root on each file system
// and records what it observes with env.Note, env.Errno, env.Expect, ...
// The observations made on shale must equal those made natively.
type testCase struct {
	name string
	fn   func(t *testing.T, e *env)
}

// cases is the table of all cases; the cases_*_test.go files add to it.
var cases []testCase

func addCases(cs ...testCase) bool {
	cases = append(cases, cs...)
	return true
}

// env is what a case operates in.
type env struct {
	t    *testing.T
	Name string // "native" or the name of a shale stack
	Root string // an empty directory, 0755 root:root, only for this case
	obs  []string
	// differs holds the observations this stack is documented to differ
	// on (stack.differs), with the reason: neither compared nor pinned.
	differs map[string]string
}

// P returns the absolute path of rel under the case's root.
func (e *env) P(rel ...string) string { return filepath.Join(append([]string{e.Root}, rel...)...) }

// Note records an observation.
func (e *env) Note(key string, v any) {
	e.obs = append(e.obs, key+" = "+fmt.Sprint(v))
}

// Errno records the errno of err ("OK" for nil).
func (e *env) Errno(key string, err error) {
	e.Note(key, errName(err))
}

// Expect records got and fails the case, on both file systems, unless it
// equals want: it pins behaviour that the native run must show too, so
// that the case provably exercises something.
func (e *env) Expect(key string, got, want any) {
	e.t.Helper()
	e.Note(key, got)
	if why, ok := e.differs[key]; ok {
		e.t.Logf("%s: %s: %v (documented difference: %s)", e.Name, key, got, why)
		return
	}
	if !reflect.DeepEqual(got, want) {
		e.t.Errorf("%s: %s: got %v, want %v", e.Name, key, got, want)
	}
}

// Known pins a documented, legitimate difference: got must be native on
// the native file system and shale on shale. Nothing is recorded for the
// comparison. Use it only for limits that shale cannot lift (say, of the
// kernel's FUSE client), and say why in a comment.
func (e *env) Known(key string, got, native, shale any) {
	e.t.Helper()
	want := native
	if e.Name != "native" {
		want = shale
	}
	if why, ok := e.differs[key]; ok {
		e.t.Logf("%s: %s: %v (documented difference: %s)", e.Name, key, got, why)
		return
	}
	if !reflect.DeepEqual(got, want) {
		e.t.Errorf("%s: %s (a known difference): got %v, want %v", e.Name, key, got, want)
	}
}

// ExpectErrno records err's errno and expects it to be want ("OK" for success).
func (e *env) ExpectErrno(key string, err error, want string) {
	e.t.Helper()
	e.Expect(key, errName(err), want)
}

// Must fails the case at once when a setup step fails, unless the stack
// documents that step as one it cannot do: then the case ends there, its
// observations so far compared, the rest listed as differences too.
func (e *env) Must(err error, what string, args ...any) {
	e.t.Helper()
	if err == nil {
		return
	}
	step := fmt.Sprintf(what, args...)
	if why, ok := e.differs[step]; ok {
		e.t.Skipf("%s: %s: %v: the case stops here (documented difference: %s)", e.Name, step, err, why)
	}
	e.t.Fatalf("%s: %s: %v", e.Name, step, err)
}

// Stat records the comparable fields of lstat(rel).
func (e *env) Stat(key, rel string) unix.Stat_t {
	e.t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(e.P(rel), &st); err != nil {
		e.Errno(key, err)
		return st
	}
	e.Note(key, statString(&st))
	return st
}

// MustStat is lstat that must succeed; it records nothing.
func (e *env) MustStat(rel string) unix.Stat_t {
	e.t.Helper()
	var st unix.Stat_t
	e.Must(unix.Lstat(e.P(rel), &st), "lstat %s", rel)
	return st
}

// Tree records every entry under rel: type and mode, owner, link count,
// size and content of files, symlink targets, devices.
func (e *env) Tree(key, rel string) {
	e.t.Helper()
	var lines []string
	root := e.P(rel)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %s", p[len(root):], errName(err)))
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			lines = append(lines, fmt.Sprintf("%s: %s", p[len(root):], errName(err)))
			return nil
		}
		s := statString(&st)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if st.Size <= 4096 {
				b, err := os.ReadFile(p)
				if err != nil {
					s += " read=" + errName(err)
				} else {
					s += fmt.Sprintf(" data=%q", b)
				}
			}
		case unix.S_IFLNK:
			t, err := os.Readlink(p)
			s += fmt.Sprintf(" -> %q %s", t, errName(err))
		}
		lines = append(lines, "."+p[len(root):]+" "+s)
		return nil
	})
	if err != nil {
		lines = append(lines, "walk: "+errName(err))
	}
	e.Note(key, "\n\t"+strings.Join(lines, "\n\t"))
}

// statString shows what must agree between file systems. Not shown:
// inode and device numbers, times (cases compare those as relations),
// st_blksize, and the size of directories (no portable meaning).
func statString(st *unix.Stat_t) string {
	s := fmt.Sprintf("%s %04o uid=%d gid=%d nlink=%d", typeName(st.Mode), st.Mode&0o7777, st.Uid, st.Gid, st.Nlink)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFCHR, unix.S_IFBLK:
		s += fmt.Sprintf(" rdev=%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	default:
		s += fmt.Sprintf(" size=%d", st.Size)
	}
	return s
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "chardev"
	case unix.S_IFBLK:
		return "blockdev"
	}
	return fmt.Sprintf("type%o", mode&unix.S_IFMT)
}

// errName names the errno in err: "OK" for nil, "EACCES", ...
func errName(err error) string {
	if err == nil {
		return "OK"
	}
	var en unix.Errno
	if errors.As(err, &en) {
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
		return fmt.Sprintf("errno%d", int(en))
	}
	return "error(" + err.Error() + ")"
}

// WriteFile creates rel with content and mode (chmod'ed, not masked).
func (e *env) WriteFile(rel, content string, mode uint32) {
	e.t.Helper()
	e.Must(os.WriteFile(e.P(rel), []byte(content), 0o600), "write %s", rel)
	e.Must(unix.Chmod(e.P(rel), mode), "chmod %s", rel)
}

// Mkdir makes rel with mode (chmod'ed, not masked; unlike os.Chmod, mode
// is the numeric mode: 0o1777 is sticky).
func (e *env) Mkdir(rel string, mode uint32) {
	e.t.Helper()
	e.Must(unix.Mkdir(e.P(rel), 0o700), "mkdir %s", rel)
	e.Must(unix.Chmod(e.P(rel), mode), "chmod %s", rel)
}

// ReadFile records the content of rel (or the errno of reading it).
func (e *env) ReadFile(key, rel string) {
	e.t.Helper()
	b, err := os.ReadFile(e.P(rel))
	if err != nil {
		e.Errno(key, err)
		return
	}
	e.Note(key, fmt.Sprintf("%q", b))
}

var (
	outcomesMu sync.Mutex
	outcomes   = map[string][]string{} // native observations by case
	caseSeq    = map[string]int{}      // runs per case and file system
)

// umasks are those every case runs under: the kernel and shale each have
// a part in masking new modes, and a umask that hides a bit hides its bugs.
var umasks = []int{0o022, 0o002, 0}

// TestConformance runs each case natively, then on every shale stack, and
// compares; all of it under each umask.
func TestConformance(t *testing.T) {
	requireSuite(t)
	names := map[string]bool{}
	for _, c := range cases {
		if names[c.name] || strings.ContainsAny(c.name, "/ ") {
			t.Fatalf("case name %q is a duplicate or has a slash or space", c.name)
		}
		names[c.name] = true
	}
	defer unix.Umask(unix.Umask(0))
	for _, u := range umasks {
		t.Run(fmt.Sprintf("umask%04o", u), func(t *testing.T) {
			unix.Umask(u)
			runCases(t)
		})
	}
}

func runCases(t *testing.T) {
	for _, c := range cases {
		t.Run("native/"+c.name, func(t *testing.T) {
			e := newEnv(t, c, "native", suite.native)
			// Keep what was observed even if the case stops early.
			defer func() {
				if os.Getenv("SHALE_CONFORMANCE_SHOW") != "" {
					t.Logf("observations:\n%s", strings.Join(e.obs, "\n"))
				}
				outcomesMu.Lock()
				outcomes[c.name] = e.obs
				outcomesMu.Unlock()
			}()
			c.fn(t, e)
		})
		for _, st := range suite.stacks {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				outcomesMu.Lock()
				want, ok := outcomes[c.name]
				outcomesMu.Unlock()
				if !ok {
					// Only a shale side was selected (-run): make the
					// reference now.
					t.Run("reference-native", func(t *testing.T) {
						e := newEnv(t, c, "native", suite.native)
						defer func() { want = e.obs }()
						c.fn(t, e)
					})
				}
				e := newEnv(t, c, st.name, st.mnt)
				e.differs = st.differsIn(c.name)
				defer func() {
					if d := diffObs(without(want, e.differs), without(e.obs, e.differs)); d != "" {
						t.Errorf("%s disagrees with native (- native, + %s):\n%s", st.name, st.name, d)
					}
				}()
				c.fn(t, e)
			})
		}
	}
}

// newEnv makes the case's own empty directory under base.
func newEnv(t *testing.T, c testCase, name, base string) *env {
	outcomesMu.Lock()
	caseSeq[name+"/"+c.name]++
	n := caseSeq[name+"/"+c.name]
	outcomesMu.Unlock()
	dir := filepath.Join(base, c.name)
	if n > 1 {
		dir += fmt.Sprintf(".%d", n)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("%s: making the case directory: %v", name, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &env{t: t, Name: name, Root: dir}
}

// diffObs lists the observations that differ, in order.
// without drops the observations whose keys are in skip.
func without(obs []string, skip map[string]string) []string {
	var out []string
	for _, o := range obs {
		key, _, _ := strings.Cut(o, " = ")
		if _, ok := skip[key]; !ok {
			out = append(out, o)
		}
	}
	return out
}

func diffObs(want, got []string) string {
	var b bytes.Buffer
	n := max(len(want), len(got))
	for i := 0; i < n; i++ {
		switch {
		case i >= len(got):
			fmt.Fprintf(&b, "- %s\n+ (missing)\n", want[i])
		case i >= len(want):
			fmt.Fprintf(&b, "- (missing)\n+ %s\n", got[i])
		case want[i] != got[i]:
			fmt.Fprintf(&b, "- %s\n+ %s\n", want[i], got[i])
		}
	}
	return b.String()
}
