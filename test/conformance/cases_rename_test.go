package conformance

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// renameCase prepares with setup, renames from to to with flags, expects
// errno want, and records the resulting tree.
func renameCase(name string, setup func(e *env), from, to string, flags uint, want string) testCase {
	return testCase{name, func(t *testing.T, e *env) {
		setup(e)
		err := unix.Renameat2(unix.AT_FDCWD, e.P(from), unix.AT_FDCWD, e.P(to), flags)
		e.ExpectErrno("rename "+from+" "+to, err, want)
		e.Tree("tree", ".")
	}}
}

func files(e *env, kv ...string) {
	for i := 0; i < len(kv); i += 2 {
		e.WriteFile(kv[i], kv[i+1], 0o644)
	}
}

var _ = addCases(
	renameCase("rename-over-file", func(e *env) { files(e, "a", "A", "b", "B") }, "a", "b", 0, "OK"),
	renameCase("rename-dir-over-empty-dir", func(e *env) {
		e.Mkdir("a", 0o755)
		files(e, "a/x", "X")
		e.Mkdir("b", 0o700)
	}, "a", "b", 0, "OK"),
	renameCase("rename-dir-over-nonempty-dir", func(e *env) {
		e.Mkdir("a", 0o755)
		e.Mkdir("b", 0o755)
		files(e, "b/x", "X")
	}, "a", "b", 0, "ENOTEMPTY"),
	renameCase("rename-file-over-dir", func(e *env) {
		files(e, "a", "A")
		e.Mkdir("b", 0o755)
	}, "a", "b", 0, "EISDIR"),
	renameCase("rename-dir-over-file", func(e *env) {
		e.Mkdir("a", 0o755)
		files(e, "b", "B")
	}, "a", "b", 0, "ENOTDIR"),
	renameCase("rename-self-file", func(e *env) { files(e, "a", "A") }, "a", "a", 0, "OK"),
	renameCase("rename-self-dir", func(e *env) { e.Mkdir("a", 0o755) }, "a", "a", 0, "OK"),
	renameCase("rename-into-own-subdir", func(e *env) {
		e.Mkdir("a", 0o755)
		e.Mkdir("a/sub", 0o755)
	}, "a", "a/sub/a", 0, "EINVAL"),
	renameCase("rename-onto-own-parent", func(e *env) {
		e.Mkdir("a", 0o755)
		e.Mkdir("a/sub", 0o755)
	}, "a/sub", "a", 0, "ENOTEMPTY"),
	renameCase("rename-missing", func(e *env) {}, "nothere", "b", 0, "ENOENT"),
	renameCase("rename-into-missing-dir", func(e *env) { files(e, "a", "A") }, "a", "no/b", 0, "ENOENT"),
	renameCase("rename-noreplace-existing", func(e *env) { files(e, "a", "A", "b", "B") }, "a", "b", unix.RENAME_NOREPLACE, "EEXIST"),
	renameCase("rename-noreplace-free", func(e *env) { files(e, "a", "A") }, "a", "b", unix.RENAME_NOREPLACE, "OK"),
	renameCase("rename-exchange-file-dir", func(e *env) {
		files(e, "a", "A")
		e.Mkdir("b", 0o750)
		files(e, "b/inside", "I")
	}, "a", "b", unix.RENAME_EXCHANGE, "OK"),
	renameCase("rename-exchange-missing", func(e *env) { files(e, "a", "A") }, "a", "b", unix.RENAME_EXCHANGE, "ENOENT"),
	renameCase("rename-exchange-noreplace", func(e *env) { files(e, "a", "A", "b", "B") }, "a", "b", unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE, "EINVAL"),
	renameCase("rename-hardlinks-same-file", func(e *env) {
		files(e, "a", "A")
		e.Must(unix.Link(e.P("a"), e.P("b")), "link")
	}, "a", "b", 0, "OK"),
	renameCase("rename-symlink-over-file", func(e *env) {
		files(e, "b", "B")
		e.Must(os.Symlink("target", e.P("a")), "symlink")
	}, "a", "b", 0, "OK"),

	// A rename is seen at once through names looked up before it, and
	// open files follow the file.
	testCase{"rename-open-file", func(t *testing.T, e *env) {
		files(e, "a", "A", "b", "B")
		fa, err := os.Open(e.P("a"))
		e.Must(err, "open")
		defer fa.Close()
		fb, err := os.Open(e.P("b"))
		e.Must(err, "open")
		defer fb.Close()
		e.Stat("stat b before", "b")
		e.ExpectErrno("rename a b", unix.Rename(e.P("a"), e.P("b")), "OK")
		e.ReadFile("b after", "b")
		e.ExpectErrno("stat a after", unix.Lstat(e.P("a"), new(unix.Stat_t)), "ENOENT")
		buf := make([]byte, 10)
		n, _ := fb.ReadAt(buf, 0)
		e.Expect("old b still readable", string(buf[:n]), "B")
		var st unix.Stat_t
		e.Must(unix.Fstat(int(fb.Fd()), &st), "fstat")
		e.Expect("old b nlink", st.Nlink, uint64(0))
		n, _ = fa.ReadAt(buf, 0)
		e.Expect("a through its open fd", string(buf[:n]), "A")
		e.Tree("tree", ".")
	}},
)
