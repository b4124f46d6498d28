package net

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Network trust: what a client acknowledged is never lost while it lives,
// and a name operation never hides its delayed data.

// TestRestartKeepsDelayedWrites: files written on a client (by cp and a
// shell's redirection, as a user would) and left delayed survive a
// restart of the server, clean (SIGTERM) or not (kill -9): client A,
// left idle, writes them back by age; client B, whose delay is an hour,
// by a sync(1) of each after the restart. Before the fix the
// reconnection dropped the cache, the kernel forgot the files' nodes,
// and the write-back, finding no path to walk, discarded the data.
func TestRestartKeepsDelayedWrites(t *testing.T) {
	for _, how := range []string{"SIGTERM", "kill -9"} {
		t.Run(strings.ReplaceAll(how, " ", ""), func(t *testing.T) {
			const grace, delay = 2 * time.Second, 4 * time.Second
			lower, s, addr, url := spriteServer(t, "--grace", grace.String())
			alog := filepath.Join(tempDir(t), "a.log")
			a := mount(t, url, "--write-delay", delay.String(), "--log", alog)
			b := mount(t, url, "--write-delay", "1h")
			src := filepath.Join(tempDir(t), "src")
			data := randomBytes(t, 100<<10+3)
			writeFile(t, src, data, 0o644)
			want := map[string][]byte{"cp": data, "echo": []byte("hello\n"), "printf": bytes.Repeat([]byte("x"), 5000)}
			write := func(m, prefix string) {
				run(t, "sh", "-c", fmt.Sprintf("cp %s %s/%scp && echo hello > %s/%secho && printf 'x%%.0s' $(seq 5000) > %s/%sprintf",
					src, m, prefix, m, prefix, m, prefix))
			}
			written := time.Now()
			write(a, "a-")
			write(b, "b-")
			if how == "SIGTERM" {
				s.stop()
			} else {
				kill9(s)
			}
			for name := range want {
				stillDelayed(t, filepath.Join(lower, "b-"+name), written)
			}
			serve(t, addr, append(spriteArgs(), "--grace", grace.String(), lower)...)
			if el := time.Since(written); el >= delay {
				t.Logf("the restart took %v, past A's delay: A's write-back by age may have come before it", el)
			}
			for name := range want {
				run(t, "sync", filepath.Join(b, "b-"+name))
			}
			for name, data := range want {
				for _, p := range []string{"a-", "b-"} {
					waitFor(t, "LOWER has "+p+name, lowerHas(filepath.Join(lower, p+name), data))
				}
			}
			// What the client says of the restart reaches its --log.
			waitFor(t, "A's log tells of the reconnection", func() string {
				if b, _ := os.ReadFile(alog); !strings.Contains(string(b), "9p connection restored") {
					return "A's log:\n" + string(b)
				}
				return ""
			})
			for _, m := range []string{a, b} {
				for name, data := range want {
					for _, p := range []string{"a-", "b-"} {
						if got := mustRead(t, filepath.Join(m, p+name)); !bytes.Equal(got, data) {
							t.Errorf("%s reads %s as %d bytes, want %d", m, p+name, len(got), len(data))
						}
					}
				}
				st := spriteStats(t, m)
				if num(st, "discarded_bytes") != 0 || num(st, "lost_bytes") != 0 {
					t.Errorf("%s after the restart: discarded %v, lost %v bytes; want 0", m, st["discarded_bytes"], st["lost_bytes"])
				}
			}
		})
	}
}

// TestHardLinkShowsDelayedData: a hard link of a file with delayed
// writes reads as the file at once, through both names (the link's reply
// carries the server's attributes, size 0, which the kernel took for the
// file's); an append after the link lands at the end; and git clone of a
// repository on the mount, which links the objects and compares them,
// works.
func TestHardLinkShowsDelayedData(t *testing.T) {
	lower, _, _, url := spriteServer(t)
	m := mount(t, url)
	run(t, "sh", "-c", fmt.Sprintf("cd %s && echo abc > a && ln a b", m))
	for _, name := range []string{"a", "b"} {
		if got := string(mustRead(t, filepath.Join(m, name))); got != "abc\n" {
			t.Errorf("after ln a b: %s reads %q, want %q", name, got, "abc\n")
		}
	}
	run(t, "sh", "-c", fmt.Sprintf("cd %s && printf 'first-line\\n' > k && ln k k2 && printf 'appended\\n' >> k && sync k", m))
	if msg := lowerHas(filepath.Join(lower, "k"), []byte("first-line\nappended\n"))(); msg != "" {
		t.Errorf("append after a link, synced: %s", msg)
	}

	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("git is needed: apt-get install git")
	}
	gitIn := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(git, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.org",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.org", "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	repo := filepath.Join(m, "repo")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	gitIn(repo, "init", "-q", "-b", "main")
	for i := range 5 {
		writeFile(t, filepath.Join(repo, fmt.Sprintf("f%d", i)), randomBytes(t, 3000+i), 0o644)
		gitIn(repo, "add", ".")
		gitIn(repo, "commit", "-q", "-m", fmt.Sprintf("commit %d", i))
	}
	gitIn(m, "clone", "-q", "repo", "clone")
	gitIn(filepath.Join(m, "clone"), "fsck", "--strict")
	if a, b := gitIn(repo, "rev-parse", "HEAD"), gitIn(filepath.Join(m, "clone"), "rev-parse", "HEAD"); a != b {
		t.Errorf("the clone's HEAD is %s, the repository's %s", b, a)
	}
	if _, err := os.Stat(filepath.Join(lower, "clone", ".git")); err != nil {
		t.Errorf("LOWER has no clone/.git: %v", err)
	}
}

// TestConflictKeepsCopy: a client cut off from the server (its link
// killed) holds delayed writes of a file; the server restarts and, past
// its grace, another client writes the file. When the first comes back,
// its reclaim is refused (writing back would undo the other's write):
// its bytes are kept in a conflict copy under lostdir, one log line
// names the file and the copy, its fsync fails with EIO, and stats count
// them as lost, not discarded. LOWER keeps the second client's file.
func TestConflictKeepsCopy(t *testing.T) {
	const grace = time.Second
	lower, s, addr, url := spriteServer(t, "--grace", grace.String())
	relay := freePort(t)
	p := delayProxy(t, relay, addr)
	t.Cleanup(func() { stopProxy(p) })
	lost, logf := tempDir(t), filepath.Join(tempDir(t), "a.log")
	a := mount(t, "9p://"+relay+"/?lostdir="+lost, "--write-delay", "1h", "--log", logf)
	mine := []byte("written on A, delayed, never written back\n")
	writeFile(t, filepath.Join(a, "f"), mine, 0o644)

	stopProxy(p) // A is cut off
	kill9(s)
	serve(t, addr, append(spriteArgs(), "--grace", grace.String(), lower)...)
	b := mount(t, url)
	theirs := []byte("written on B while A was away\n")
	syncFile(t, filepath.Join(b, "f"), theirs)

	p = delayProxy(t, relay, addr) // A comes back, and reclaims
	out, err := exec.Command("sync", filepath.Join(a, "f")).CombinedOutput()
	if err == nil {
		t.Errorf("sync of A's f after a refused reclaim succeeded; want EIO")
	} else if !strings.Contains(string(out), "Input/output error") {
		t.Errorf("sync of A's f: %v %s; want EIO", err, out)
	}
	if msg := lowerHas(filepath.Join(lower, "f"), theirs)(); msg != "" {
		t.Errorf("LOWER: %s (B's write must stay)", msg)
	}
	var copies []string
	filepath.Walk(lost, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			copies = append(copies, p)
		}
		return nil
	})
	if len(copies) != 1 {
		t.Fatalf("conflict copies under %s: %v; want one", lost, copies)
	}
	if got := mustRead(t, copies[0]); !bytes.Equal(got, mine) {
		t.Errorf("the conflict copy %s holds %q, want %q", copies[0], got, mine)
	}
	if !strings.HasSuffix(filepath.Dir(copies[0]), "_"+strings.ReplaceAll(relay, ":", "_")) || !strings.HasPrefix(filepath.Base(copies[0]), "f.") {
		t.Errorf("the conflict copy is %s: want it named after the server and the file", copies[0])
	}
	log := string(mustRead(t, logf))
	if !strings.Contains(log, "conflict copy") || !strings.Contains(log, copies[0]) || !strings.Contains(log, "file=/f") {
		t.Errorf("A's log does not name the file and its copy:\n%s", log)
	}
	st := spriteStats(t, a)
	if num(st, "lost_bytes") != float64(len(mine)) || num(st, "discarded_bytes") != 0 {
		t.Errorf("A's stats: lost %v, discarded %v; want %d lost, 0 discarded", st["lost_bytes"], st["discarded_bytes"], len(mine))
	}
	if got := mustRead(t, filepath.Join(a, "f")); !bytes.Equal(got, theirs) {
		t.Errorf("A reads f as %q, want the server's %q", got, theirs)
	}
}

// TestRestartRightAfterCreate: files created and written (the write
// delayed) just before the server is killed are written back after its
// restart, not kept as conflict copies: the client's right to reclaim is
// on the server's disk before its open for writing is answered, and a
// file created just before the kill is found by its name.
func TestRestartRightAfterCreate(t *testing.T) {
	const grace = 2 * time.Second
	lower, s, addr, url := spriteServer(t, "--grace", grace.String())
	m := mount(t, url, "--write-delay", "1h")
	want := map[string][]byte{}
	for round := range 5 {
		for i := range 4 {
			name := fmt.Sprintf("r%d-%d", round, i)
			want[name] = randomBytes(t, 100+round*1000+i)
			writeFile(t, filepath.Join(m, name), want[name], 0o644)
		}
		kill9(s)
		s = serve(t, addr, append(spriteArgs(), "--grace", grace.String(), lower)...)
		for name := range want {
			run(t, "sync", filepath.Join(m, name))
		}
	}
	for name, data := range want {
		if msg := lowerHas(filepath.Join(lower, name), data)(); msg != "" {
			t.Errorf("LOWER's %s: %s", name, msg)
		}
	}
	if st := spriteStats(t, m); num(st, "lost_bytes") != 0 || num(st, "discarded_bytes") != 0 {
		t.Errorf("after 5 kill -9 restarts: lost %v, discarded %v bytes; want 0", st["lost_bytes"], st["discarded_bytes"])
	}
}

// TestRestartAfterLinkChain: delayed data written through one name of a
// hard-linked file survives that name's unlink, a rename of the other
// name, and a server restart (the sequence of the fault loops' loss in
// c2.10 f12, which this does not reproduce yet): the data is the
// file's, which lives on under its new name, and goes back through it.
func TestRestartAfterLinkChain(t *testing.T) {
	for _, how := range []string{"SIGTERM", "kill -9"} {
		t.Run(strings.ReplaceAll(how, " ", ""), func(t *testing.T) {
			const grace = 2 * time.Second
			lower, s, addr, url := spriteServer(t, "--grace", grace.String())
			m := mount(t, url, "--write-delay", "1h")
			first, second, last := randomBytes(t, 2382), randomBytes(t, 2680), randomBytes(t, 161)
			writeFile(t, filepath.Join(m, "f22"), randomBytes(t, 1864), 0o644)
			run(t, "ln", filepath.Join(m, "f22"), filepath.Join(m, "f23"))
			writeFile(t, filepath.Join(m, "f23"), first, 0o644)
			writeFile(t, filepath.Join(m, "f22"), second, 0o644)
			run(t, "rm", filepath.Join(m, "f22"))
			run(t, "mv", filepath.Join(m, "f23"), filepath.Join(m, "f12"))
			if how == "SIGTERM" {
				s.stop()
			} else {
				kill9(s)
			}
			serve(t, addr, append(spriteArgs(), "--grace", grace.String(), lower)...)
			if err := appendSync(t, filepath.Join(m, "f12"), last); err != nil {
				t.Errorf("fsync f12: %v", err)
			}
			want := append(slices.Clone(second), last...)
			if msg := lowerHas(filepath.Join(lower, "f12"), want)(); msg != "" {
				t.Errorf("LOWER's f12: %s", msg)
			}
			if st := spriteStats(t, m); num(st, "lost_bytes") != 0 || num(st, "discarded_bytes") != 1864+2382 {
				t.Errorf("lost %v, discarded %v bytes; want 0 and %d", st["lost_bytes"], st["discarded_bytes"], 1864+2382)
			}
		})
	}
}

// appendSync appends data to the file p as a program would (O_APPEND),
// and returns what the fsync after it said; it fails t if the open or the
// write fails.
func appendSync(t *testing.T, p string, data []byte) error {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return f.Sync()
}
