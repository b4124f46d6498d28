package net

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
			a := mount(t, url, "--write-delay", delay.String())
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
