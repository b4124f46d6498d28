package conformance

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pjdfstest is the Rust port of the POSIX file system test suite (the
// Rust registry's, BSD-2), which scripts/setup.sh installs with cargo.
// docs/pjdfstest.md says what it covers of the C suite and what it found.
const pjdfstestVersion = "0.2.2"

// pjdfstestConfig enables what Linux and ext4 have, and names the users
// the cases switch to (nobody's group is nogroup on Debian). Remounting
// read-only (the EROFS cases) is not allowed: they are skipped everywhere.
// The nap between steps that must change a time is above the coarse
// clock's tick (4 ms), which stamps a directory's times on ext4.
const pjdfstestConfig = `[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}
[settings]
naptime = 0.02
allow_remount = false
[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
`

// pjdfstestDiffers are the cases whose outcome is documented to differ
// from native, on every FUSE mount ("*") or on one stack: case ->
// outcome and reason. docs/pjdfstest.md repeats them.
var pjdfstestDiffers = map[string]map[string][2]string{
	"*": {
		"link::link_count_max": {"skipped", "glibc's pathconf(_PC_LINK_MAX) knows the limit of a file system by its magic number, and FUSE's it does not know, so the case cannot size itself"},
	},
	"diod": func() map[string][2]string {
		m := map[string][2]string{
			"unlink::open_file_not_freed": {"FAILED", "diod's fids are paths: an open file that is unlinked is gone for the client"},
		}
		for _, c := range []string{"chmod", "chown", "chown::lchown", "link", "mkdir", "mkfifo", "mknod", "mknod::privileged", "open", "rename", "rmdir", "symlink", "truncate", "unlink"} {
			m[c+"::enametoolong_path"] = [2]string{"FAILED", "diod opens a path of its export's root and the client's path, which exceeds PATH_MAX where the client's path alone does not"}
		}
		return m
	}(),
}

// pjdfstestStacks names the stacks of the CI run: the loop view,
// shale's client of shale serve, and a volume where its engines are given. SHALE_PJDFSTEST=all runs every stack
// (the full run, docs/pjdfstest.md); a comma-separated list, those.
func pjdfstestStacks() []*stack {
	want := os.Getenv("SHALE_PJDFSTEST")
	if want == "" {
		want = "loop,9p"
		if os.Getenv("SHALE_ETCD") != "" {
			want += ",volume" // the engines are given (volume_test.go)
		}
	}
	var out []*stack
	for _, st := range suite.stacks {
		if want == "all" || slices.Contains(strings.Split(want, ","), st.name) {
			out = append(out, st)
		}
	}
	return out
}

// TestPjdfstest runs every case of pjdfstest natively and on each stack
// of pjdfstestStacks, and checks that each case ends the same way on the
// stack as natively (ok, FAILED or skipped), but for pjdfstestDiffers;
// natively no case may fail.
func TestPjdfstest(t *testing.T) {
	requireSuite(t)
	bin, err := findPjdfstest()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(suite.base, "pjdfstest.toml")
	if err := os.WriteFile(cfg, []byte(pjdfstestConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// A second file system for the EXDEV cases, the same for every run:
	// tmpfs, which neither ext4 nor a FUSE mount is.
	second, err := os.MkdirTemp("/dev/shm", "pjd")
	if err != nil {
		t.Fatalf("a directory on a second file system for the EXDEV cases: %v", err)
	}
	defer os.RemoveAll(second)
	os.Chmod(second, 0o755)

	native, err := runPjdfstest(t, bin, cfg, filepath.Join(suite.native, "pjdfstest"), second)
	if err != nil {
		t.Fatal(err)
	}
	for name, res := range native {
		if res == "FAILED" {
			t.Errorf("native: %s FAILED: the reference must pass (the native file system or the configuration is not what the suite assumes)", name)
		}
	}
	for _, st := range pjdfstestStacks() {
		t.Run(st.name, func(t *testing.T) {
			got, err := runPjdfstest(t, bin, cfg, filepath.Join(st.mnt, "pjdfstest"), second)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range comparePjdfstest(st.name, native, got) {
				t.Error(d)
			}
		})
	}
}

// findPjdfstest finds pjdfstest of pjdfstestVersion on PATH or in cargo's
// bin directory.
func findPjdfstest() (string, error) {
	bin, err := exec.LookPath("pjdfstest")
	if err != nil {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cargo", "bin", "pjdfstest")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.Contains(string(out), pjdfstestVersion) {
		return "", fmt.Errorf("pjdfstest %s not found (%s: %q, %v): run ./scripts/setup.sh, which installs it with cargo", pjdfstestVersion, bin, bytes.TrimSpace(out), err)
	}
	return bin, nil
}

// runPjdfstest runs every case (or those whose names contain only) in a
// new directory dir and returns each case's outcome by name.
func runPjdfstest(t *testing.T, bin, cfg, dir, second string, only ...string) (map[string]string, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	// The cases bind unix sockets by their paths, which may be no longer
	// than 107 bytes, 88 of them pjdfstest's: it runs in dir through a
	// symbolic link of a short name.
	short, err := os.MkdirTemp("/tmp", "pjd")
	if err != nil {
		return nil, err
	}
	os.Remove(short)
	if err := os.Symlink(dir, short); err != nil {
		return nil, err
	}
	defer os.Remove(short)
	cmd := exec.Command(bin, append([]string{"-c", cfg, "-p", short, "-s", second}, only...)...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	res := parsePjdfstest(out)
	summary := ""
	if i := bytes.LastIndex(out, []byte("Summary:")); i >= 0 {
		summary = string(bytes.TrimSpace(out[i:]))
	}
	t.Logf("pjdfstest in %s: %s", dir, summary)
	if len(res) == 0 || summary == "" {
		return nil, fmt.Errorf("pjdfstest in %s: %v, no results:\n%s", dir, err, out)
	}
	if err != nil {
		// Failing cases make it exit non-zero; their details show here.
		t.Logf("pjdfstest in %s: %v:\n%s", dir, err, failures(out))
	}
	return res, nil
}

// parsePjdfstest reads pjdfstest's report: a line per case, its name and
// outcome, each followed by indented details.
func parsePjdfstest(out []byte) map[string]string {
	res := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "\t") || !strings.Contains(f[0], "::") {
			continue
		}
		res[f[0]] = strings.Join(f[1:], " ")
	}
	return res
}

// failures is the part of pjdfstest's report about failing cases.
func failures(out []byte) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "Backtrace") {
			in = strings.HasSuffix(line, "FAILED")
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// comparePjdfstest lists how stack's outcomes differ from native's,
// beyond pjdfstestDiffers, and the documented differences that did not
// show (the list must stay true).
func comparePjdfstest(stack string, native, got map[string]string) []string {
	differs := maps.Clone(pjdfstestDiffers["*"])
	maps.Copy(differs, pjdfstestDiffers[stack])
	names := slices.Collect(maps.Keys(native))
	for name := range got {
		if _, ok := native[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var ds []string
	for _, name := range names {
		want, why := native[name], "native"
		if d, known := differs[name]; known {
			want, why = d[0], "documented: "+d[1]+"; if no longer so, update pjdfstestDiffers and docs/pjdfstest.md"
		}
		if g := got[name]; g != want {
			ds = append(ds, fmt.Sprintf("%s: %q, want %q (%s)", name, g, want, why))
		}
	}
	return ds
}
