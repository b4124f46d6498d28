package crypt

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shalefs/shale/internal/shaletest"
)

// The shale init and shale passwd commands, run as a user would.

var shaleBin struct {
	once sync.Once
	path string
	err  error
}

// shale runs the command with stdin and returns its exit code and output.
// The binary is built once, on first use, so that tests of the codecs
// alone do not pay for it.
func shale(t *testing.T, stdin string, args ...string) (int, string) {
	t.Helper()
	shaleBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "shale-crypt-cli")
		if err != nil {
			shaleBin.err = err
			return
		}
		shaleBin.path, shaleBin.err = shaletest.Build(dir)
	})
	if shaleBin.err != nil {
		t.Fatal(shaleBin.err)
	}
	cmd := exec.Command(shaleBin.path, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shaleBin.path != "" {
		os.RemoveAll(filepath.Dir(shaleBin.path))
	}
	os.Exit(code)
}

func wantOK(t *testing.T, code int, out string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
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

func passfile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pass")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const cheap = "--scrypt-logn=10"

func TestCLIInit(t *testing.T) {
	lower := filepath.Join(t.TempDir(), "lower")
	code, out := shale(t, "", "init", "--layer", "crypt", cheap, "--passfile", passfile(t, "first line\r\nsecond line\n"), lower)
	wantOK(t, code, out)
	if _, err := Open(ctx, lowerOf(t, lower), lower, []byte("first line")); err != nil {
		t.Fatalf("open with the passfile's first line: %v", err)
	}
	code, out = shale(t, "x\n", "init", "--layer", "crypt", cheap, lower)
	wantOneLineError(t, code, out, "already a crypt directory")

	// From standard input, which is not a terminal here.
	piped := t.TempDir()
	code, out = shale(t, "from stdin\n", "init", "--layer", "crypt", cheap, piped)
	wantOK(t, code, out)
	if _, err := Open(ctx, lowerOf(t, piped), piped, []byte("from stdin")); err != nil {
		t.Fatalf("open with the piped passphrase: %v", err)
	}

	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "old"), nil, 0o644)
	code, out = shale(t, "p\n", "init", "--layer", "crypt", cheap, full)
	wantOneLineError(t, code, out, "--force")
	code, out = shale(t, "p\n", "init", "--layer", "crypt", cheap, "--force", full)
	wantOK(t, code, out)

	code, out = shale(t, "p\n", "init", cheap, t.TempDir())
	wantOneLineError(t, code, out, "--layer crypt")
	code, out = shale(t, "p\n", "init", "--layer", "rot13", t.TempDir())
	wantOneLineError(t, code, out, "only --layer crypt")
	code, out = shale(t, "", "init", "--layer", "crypt", cheap, t.TempDir())
	wantOneLineError(t, code, out, "standard input")
	code, out = shale(t, "", "init", "--layer", "crypt", cheap, "--passfile", passfile(t, "\nsecond"), t.TempDir())
	wantOneLineError(t, code, out, "empty first line")
	code, out = shale(t, "", "init", "--layer", "crypt", "--passfile", filepath.Join(t.TempDir(), "none"), t.TempDir())
	wantOneLineError(t, code, out, "no such file")
	code, out = shale(t, "p\n", "init", "--layer", "crypt", cheap)
	wantOneLineError(t, code, out, "usage")
}

func TestCLIPasswd(t *testing.T) {
	lower := t.TempDir()
	code, out := shale(t, "old\n", "init", "--layer", "crypt", cheap, lower)
	wantOK(t, code, out)
	before, err := Open(ctx, lowerOf(t, lower), lower, []byte("old"))
	if err != nil {
		t.Fatal(err)
	}

	code, out = shale(t, "wrong\nnew\n", "passwd", lower)
	wantOneLineError(t, code, out, "wrong passphrase for "+filepath.Join(lower, ConfigName))
	if out != "shale: wrong passphrase for "+filepath.Join(lower, ConfigName)+"\n" {
		t.Errorf("wrong passphrase: %q", out)
	}
	code, out = shale(t, "old\n", "passwd", lower)
	wantOneLineError(t, code, out, "new passphrase")

	// Old and new on standard input, one line each.
	code, out = shale(t, "old\nnew\n", "passwd", lower)
	wantOK(t, code, out)
	// From files.
	code, out = shale(t, "", "passwd", "--passfile", passfile(t, "new\n"), "--new-passfile", passfile(t, "newer"), lower)
	wantOK(t, code, out)
	// Old from a file, new from standard input.
	code, out = shale(t, "newest\n", "passwd", "--passfile", passfile(t, "newer"), lower)
	wantOK(t, code, out)

	for _, p := range []string{"old", "new", "newer"} {
		if _, err := Open(ctx, lowerOf(t, lower), lower, []byte(p)); err == nil {
			t.Errorf("the replaced passphrase %q still opens", p)
		}
	}
	after, err := Open(ctx, lowerOf(t, lower), lower, []byte("newest"))
	if err != nil {
		t.Fatal(err)
	}
	if !sameKeys(before, after) {
		t.Error("the master key changed with the passphrase")
	}

	code, out = shale(t, "p\nq\n", "passwd", t.TempDir())
	wantOneLineError(t, code, out, "shale init --layer crypt")
	os.WriteFile(filepath.Join(lower, ConfigName), []byte("{garbage"), 0o600)
	code, out = shale(t, "newest\nq\n", "passwd", lower)
	wantOneLineError(t, code, out, "damaged")
}

// init --no-holes makes a format-2 directory with fill_holes; a passfile
// others can read is used with a one-line warning; a root whose ID is lost
// is refused by mount in one line.
func TestCLIAuditFixes(t *testing.T) {
	lower := t.TempDir()
	loose := passfile(t, "p\n")
	os.Chmod(loose, 0o644)
	code, out := shale(t, "", "init", "--layer", "crypt", cheap, "--no-holes", "--passfile", loose, lower)
	wantOK(t, code, out)
	if want := "shale: warning: passphrase file " + loose + " is readable by group or others (mode 0644): chmod 600 " + loose + "\n"; out != want {
		t.Errorf("init with a passfile of mode 0644 printed %q, want %q", out, want)
	}
	l, err := Open(ctx, lowerOf(t, lower), lower, []byte("p"))
	if err != nil {
		t.Fatal(err)
	}
	if l.version != configVersion || !l.fillHoles {
		t.Errorf("init --no-holes made version %d, fill_holes %v", l.version, l.fillHoles)
	}
	code, out = shale(t, "", "passwd", "--passfile", passfile(t, "p"), "--new-passfile", passfile(t, "q"), lower)
	wantOK(t, code, out)
	if l, err = Open(ctx, lowerOf(t, lower), lower, []byte("q")); err != nil || !l.fillHoles {
		t.Errorf("passwd lost fill_holes (%v)", err)
	}

	os.WriteFile(filepath.Join(lower, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), nil, 0o644) // a file of the view
	os.Remove(filepath.Join(lower, dirIDName))
	code, out = shale(t, "", "mount", "--layer", "crypt", "--passfile", passfile(t, "q"), lower, t.TempDir())
	wantOneLineError(t, code, out, filepath.Join(lower, dirIDName)+", the root directory's ID, is missing: restore it from a backup")
	if _, err := os.Stat(filepath.Join(lower, dirIDName)); !os.IsNotExist(err) {
		t.Errorf("mount made a new root ID: %v", err)
	}
}
