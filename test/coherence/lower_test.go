package coherence

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// stackFile is a stack to mount with `shale mount --stack`.
type stackFile struct {
	lower  string
	layers string // its [[layer]] tables, bottom-most first
	views  []int  // a view of each of these layers
	nobody bool   // mount and unmount as user nobody, who owns lower
}

const nobody = 65534

// mount mounts s, with args added to shale mount, and returns the views'
// mountpoints; they are unmounted when t ends.
func (s stackFile) mount(t *testing.T, args ...string) []string {
	t.Helper()
	base := t.TempDir()
	toml := fmt.Sprintf("lower = %q\n%s", s.lower, s.layers)
	var mnts []string
	for i, l := range s.views {
		m := filepath.Join(base, fmt.Sprintf("view%d-layer%d", i, l))
		if err := os.Mkdir(m, 0o755); err != nil {
			t.Fatal(err)
		}
		mnts = append(mnts, m)
		toml += fmt.Sprintf("[[view]]\nlayer = %d\nmountpoint = %q\n", l, m)
	}
	file := filepath.Join(base, "stack.toml")
	if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if s.nobody {
		reachable(t, base, filepath.Dir(base)) // and t.TempDir's parent
		for _, m := range mnts {
			if err := os.Chown(m, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
	}
	if out, err := s.shale(append([]string{"mount", "--stack", file}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("shale mount --stack: %v: %s", err, out)
	}
	t.Cleanup(func() {
		for _, m := range mnts {
			unmountView(t, s.shale, m)
		}
	})
	return mnts
}

// shale runs the shale command, as nobody if s says so.
func (s stackFile) shale(args ...string) *exec.Cmd {
	if s.nobody {
		return asNobody(shaleBin, args...)
	}
	return exec.Command(shaleBin, args...)
}

// asNobody is exec.Command for a command run as user nobody.
func asNobody(name string, args ...string) *exec.Cmd {
	return exec.Command("setpriv", append([]string{fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups", name}, args...)...)
}

// reachable lets everyone reach dirs, which the test made for their
// owner only.
func reachable(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// tree describes every file beneath root as a view shows it: its path,
// mode, size and contents. With flat, the entries of a directory with the
// setuid bit are read from its buckets, as shard shows them. Sizes of
// directories differ between layers and are left out.
func tree(root string, flat bool) map[string]string {
	files := map[string]string{}
	var walk func(dir, shown string)
	walk = func(dir, shown string) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			files[shown+"/"] = err.Error()
			return
		}
		st, _ := os.Lstat(dir)
		for _, e := range ents {
			p, name := filepath.Join(dir, e.Name()), filepath.Join(shown, e.Name())
			if flat && st != nil && st.Mode()&fs.ModeSetuid != 0 && strings.HasPrefix(e.Name(), ".shard-") {
				walk(p, shown) // a bucket: its entries are the directory's
				continue
			}
			files[name] = describe(p, same)
			if e.IsDir() {
				walk(p, name)
			}
		}
	}
	walk(root, "")
	return files
}

// describe is what tree says of the file at p, with its contents decoded
// by decode.
func describe(p string, decode func(string) string) string {
	st, err := os.Lstat(p)
	switch {
	case err != nil:
		return err.Error()
	case st.IsDir():
		return st.Mode().String()
	}
	return fileDesc(st.Mode(), st.Size(), decode(read(p)))
}

// fileDesc is what tree says of a file: its contents in full if short.
func fileDesc(mode os.FileMode, size int64, data string) string {
	if len(data) > 64 {
		return fmt.Sprintf("%v %d %d bytes, sha256 %x", mode, size, len(data), sha256.Sum256([]byte(data)))
	}
	return fmt.Sprintf("%v %d %q", mode, size, data)
}

// differences lists how got differs from want, or is empty.
func differences(got, want map[string]string) []string {
	var ds []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			ds = append(ds, fmt.Sprintf("%s: missing, want %s", p, w))
		} else if g != w {
			ds = append(ds, fmt.Sprintf("%s: got %s, want %s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			ds = append(ds, fmt.Sprintf("%s: %s, want none", p, g))
		}
	}
	slices.Sort(ds)
	return ds
}

func same(s string) string { return s }

// settle is how long a change made beside the stack has to reach the
// views. The watcher takes milliseconds (TestTorture logs the slowest);
// the bound is generous so that a busy machine makes a check slower,
// never a failure: only a change that never arrives is stale.
const settle = 30 * time.Second

// within polls check until it reports no differences, for up to settle;
// it returns the last differences.
func within(check func() []string) []string {
	for deadline := time.Now().Add(settle); ; {
		ds := check()
		if len(ds) == 0 || time.Now().After(deadline) {
			return ds
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lowerViews are views of every kind over lower directories, each
// checked against what its lower directory holds: loop, rot13 and shard
// over one, crypt over another (rot13 of ciphertext would not compare as
// text).
type lowerViews struct {
	lower, cryptLower  string
	loop, r13, shd, cr string
	// crypt's files: their plaintext, and their names in cryptLower.
	plain map[string]string
	enc   map[string]string
}

// mountLowerViews mounts loop and rot13 views (one stack) and a shard
// view over a new lower directory, and a crypt view over another, with
// args for each shale mount.
func mountLowerViews(t *testing.T, args ...string) *lowerViews {
	base := t.TempDir()
	lower, cryptLower := filepath.Join(base, "lower"), filepath.Join(base, "crypt")
	pass := filepath.Join(base, "pass")
	os.Mkdir(lower, 0o755)
	os.Mkdir(cryptLower, 0o755)
	os.WriteFile(pass, []byte("lower\n"), 0o600)
	if out, err := exec.Command(shaleBin, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", cryptLower).CombinedOutput(); err != nil {
		t.Fatalf("shale init: %v: %s", err, out)
	}
	plain := stackFile{lower: lower, layers: "[[layer]]\nname = \"rot13\"\n", views: []int{0, 1}}.mount(t, args...)
	shd := stackFile{lower: lower, layers: "[[layer]]\nname = \"shard\"\n", views: []int{1}}.mount(t, args...)
	cr := stackFile{lower: cryptLower, layers: fmt.Sprintf("[[layer]]\nname = \"crypt\"\npassfile = %q\n", pass), views: []int{1}}.mount(t, args...)
	return &lowerViews{lower: lower, cryptLower: cryptLower, loop: plain[0], r13: plain[1], shd: shd[0], cr: cr[0], plain: map[string]string{}, enc: map[string]string{}}
}

// create makes name with content through the crypt view and learns its
// name in lower.
func (v *lowerViews) create(t *testing.T, name, content string) {
	t.Helper()
	before := names(v.cryptLower)
	if err := os.WriteFile(filepath.Join(v.cr, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for n := range names(v.cryptLower) {
		if !before[n] {
			v.enc[name] = n
		}
	}
	if v.enc[name] == "" {
		t.Fatalf("no new lower name for %s", name)
	}
	v.plain[name] = content
}

// disagree lists, for every view, how it differs from what lower holds.
func (v *lowerViews) disagree() []string {
	want := tree(v.lower, false)
	r13 := map[string]string{}
	for p := range want {
		r13[p] = describe(filepath.Join(v.lower, p), rot13)
	}
	cr := map[string]string{}
	for name, content := range v.plain {
		st, err := os.Lstat(filepath.Join(v.cryptLower, v.enc[name]))
		if err != nil {
			cr[name] = err.Error()
			continue
		}
		cr[name] = fileDesc(st.Mode(), int64(len(content)), content)
	}
	var ds []string
	for _, c := range []struct {
		view      string
		got, want map[string]string
	}{
		{"loop", tree(v.loop, false), want},
		{"rot13", tree(v.r13, false), r13},
		{"shard", tree(v.shd, false), tree(v.lower, true)},
		{"crypt", tree(v.cr, false), cr},
	} {
		for _, d := range differences(c.got, c.want) {
			ds = append(ds, c.view+": "+d)
		}
	}
	return ds
}

// Changes made directly in the lower directory, while every view holds
// hour-long caches of everything, show in every view (within settle),
// with either watcher.
func TestLowerChangesShow(t *testing.T) {
	for _, how := range []string{"fanotify", "inotify"} {
		t.Run(how, func(t *testing.T) {
			v := mountLowerViews(t, "--watch="+how)
			l := func(p string) string { return filepath.Join(v.lower, p) }
			c := func(p string) string { return filepath.Join(v.cryptLower, p) }
			os.WriteFile(l("p"), []byte("alpha"), 0o644)
			os.Mkdir(l("sub"), 0o755)
			os.WriteFile(l("sub/q"), []byte("bravo"), 0o644)
			// A managed directory, made through shard so that its
			// files live in buckets.
			m := filepath.Join(v.shd, "m")
			os.Mkdir(m, 0o755)
			os.Chmod(m, 0o755|os.ModeSetuid)
			os.WriteFile(filepath.Join(m, "x"), []byte("xray"), 0o644)
			os.WriteFile(filepath.Join(m, "y"), []byte("yankee"), 0o644)
			for name, content := range map[string]string{"a": "apple", "b": "banana", "c": "cherry", "t": "tangerine"} {
				v.create(t, name, content)
			}
			os.Remove(filepath.Join(v.cr, "c")) // its lower name stays known
			delete(v.plain, "c")
			if ds := v.disagree(); len(ds) > 0 {
				t.Fatalf("views disagree with lower before any change beside them:\n%s", strings.Join(ds, "\n"))
			}
			// Read everything again: the change after a file's first read
			// may show without the watcher (seen with --coherence=off),
			// and every step must depend on it.
			v.disagree()
			steps := []struct {
				name   string
				change func() error
			}{
				{"write", func() error { return os.WriteFile(l("p"), []byte("alpha, longer"), 0o644) }},
				{"append in a subdirectory", func() error {
					f, err := os.OpenFile(l("sub/q"), os.O_WRONLY|os.O_APPEND, 0)
					if err != nil {
						return err
					}
					defer f.Close()
					_, err = f.WriteString(" charlie")
					return err
				}},
				{"truncate", func() error { return os.Truncate(l("p"), 3) }},
				{"chmod", func() error { return os.Chmod(l("sub/q"), 0o600) }},
				{"rename to another directory", func() error { return os.Rename(l("p"), l("sub/p2")) }},
				{"create", func() error { return os.WriteFile(l("n"), []byte("november"), 0o644) }},
				{"unlink", func() error { return os.Remove(l("sub/q")) }},
				{"mkdir", func() error { return os.Mkdir(l("d"), 0o755) }},
				{"create in a new directory", func() error { return os.WriteFile(l("d/f"), []byte("foxtrot"), 0o644) }},
				{"write in a new directory", func() error { return os.WriteFile(l("d/f"), []byte("golf"), 0o644) }},
				{"shard: write in a bucket", func() error {
					return os.WriteFile(l("m/"+bucket("x")+"/x"), []byte("xray, again"), 0o644)
				}},
				{"shard: rename to another bucket", func() error {
					os.Mkdir(l("m/"+bucket("z")), 0o755)
					return os.Rename(l("m/"+bucket("x")+"/x"), l("m/"+bucket("z")+"/z"))
				}},
				{"shard: unlink in a bucket", func() error { return os.Remove(l("m/" + bucket("y") + "/y")) }},
				{"shard: create in a bucket", func() error {
					os.Mkdir(l("m/"+bucket("w")), 0o755)
					return os.WriteFile(l("m/"+bucket("w")+"/w"), []byte("whiskey"), 0o644)
				}},
				{"crypt: another file's ciphertext", func() error {
					b, err := os.ReadFile(c(v.enc["t"]))
					if err != nil {
						return err
					}
					v.plain["a"] = v.plain["t"]
					return os.WriteFile(c(v.enc["a"]), b, 0o644)
				}},
				{"crypt: rename", func() error {
					v.plain["c"] = v.plain["b"]
					delete(v.plain, "b")
					return os.Rename(c(v.enc["b"]), c(v.enc["c"]))
				}},
				{"crypt: unlink", func() error {
					delete(v.plain, "a")
					return os.Remove(c(v.enc["a"]))
				}},
			}
			for _, s := range steps {
				if err := s.change(); err != nil {
					t.Fatalf("%s in lower: %v", s.name, err)
				}
				if ds := within(v.disagree); len(ds) > 0 {
					t.Errorf("%s in lower: %v later:\n%s", s.name, settle, strings.Join(ds, "\n"))
				}
			}
		})
	}
}

// Without root, fanotify cannot mark the lower file system: a stack
// starts all the same, watching with inotify, and changes made directly
// in the lower directory show (within settle).
func TestStackWithoutRoot(t *testing.T) {
	fuseForEveryone(t)
	base := t.TempDir()
	reachable(t, base, filepath.Dir(base), filepath.Dir(shaleBin))
	lower := filepath.Join(base, "lower")
	os.Mkdir(lower, 0o755)
	if err := os.Chown(lower, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	m := stackFile{lower: lower, layers: "[[layer]]\nname = \"rot13\"\n", views: []int{0, 1}, nobody: true}.mount(t)
	// Only nobody may use the views (no allow_other), so nobody reads.
	showsChanges(t, lower, m[1], m[0], asNobody)
}

// showsChanges writes f and makes g in lower and checks that a rot13
// view of it, r13, shows f's contents and a view list its names, before
// and within settle after; run runs the cat and ls that read them.
func showsChanges(t *testing.T, lower, r13, list string, run func(string, ...string) *exec.Cmd) {
	t.Helper()
	f := filepath.Join(lower, "f")
	show := func() []string {
		var ds []string
		for _, c := range []struct{ got, want string }{
			{out(run("cat", filepath.Join(r13, "f"))), rot13(read(f))},
			{out(run("ls", list)), out(exec.Command("ls", lower))},
		} {
			if c.got != c.want {
				ds = append(ds, fmt.Sprintf("got %q, want %q", c.got, c.want))
			}
		}
		return ds
	}
	os.WriteFile(f, []byte("alpha"), 0o644)
	for range 2 { // twice, as in TestLowerChangesShow
		if ds := show(); len(ds) > 0 {
			t.Fatalf("before any change: %v", ds)
		}
	}
	os.WriteFile(f, []byte("bravo, longer"), 0o644)
	os.WriteFile(filepath.Join(lower, "g"), nil, 0o644)
	if ds := within(show); len(ds) > 0 {
		t.Errorf("%v after changes in lower: %v", settle, ds)
	}
}

// fuseForEveryone opens /dev/fuse to every user while t runs, as udev
// does on every distribution (fusermount3 opens it as the user): some
// containers make it root's only.
func fuseForEveryone(t *testing.T) {
	st, err := os.Stat("/dev/fuse")
	if err != nil {
		t.Fatalf("%v: load the fuse module (modprobe fuse)", err)
	}
	if st.Mode().Perm()&0o006 == 0o006 {
		return
	}
	t.Logf("/dev/fuse is %v: opening it to every user while the test runs", st.Mode().Perm())
	if err := os.Chmod("/dev/fuse", 0o666); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod("/dev/fuse", st.Mode().Perm()) })
}

// out runs cmd and returns its output, or its error.
func out(cmd *exec.Cmd) string {
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%v: %s", err, b)
	}
	return string(b)
}

// fanotify cannot mark a FUSE file system (it has no fsid to tell files
// by): over one, a stack watches with inotify, as root too, and
// changes made in its lower directory show (within settle).
func TestStackOverFUSE(t *testing.T) {
	base := t.TempDir()
	fuse := stackFile{lower: base, views: []int{0}}.mount(t)[0]
	m := stackFile{lower: fuse, layers: "[[layer]]\nname = \"rot13\"\n", views: []int{1}}.mount(t)
	showsChanges(t, fuse, m[0], m[0], exec.Command)
}
