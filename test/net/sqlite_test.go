package net

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SQLite across two 9P clients (issue 23). In rollback-journal mode a
// writer on client A and readers on client B share a database through
// locks and close-to-open, as SQLite expects of a network file system.
// In WAL mode its index (the -shm file) is a mapping shared by every
// connection, which two machines cannot share: the second client's
// mapping fails, and SQLite reports a disk I/O error, never a stale read
// or a lost row.

const (
	sqliteCommits = 200 // the writer's transactions
	sqliteRows    = 20  // rows each: 4,000 in all, as the issue counted
)

// sqliteShell is a sqlite3 process that runs statements as it is given
// them.
type sqliteShell struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
	n   int
}

func startSqlite(t *testing.T, db string) *sqliteShell {
	t.Helper()
	cmd := exec.Command("sqlite3", "-bail", db)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sqliteShell{t: t, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { s.close() })
	s.do(".timeout 120000")
	return s
}

// do runs stmts and returns their output, once they are done.
func (s *sqliteShell) do(stmts string) string {
	s.t.Helper()
	s.n++
	mark := fmt.Sprintf("done %d", s.n)
	fmt.Fprintf(s.in, "%s\nSELECT '%s';\n", stmts, mark)
	var out strings.Builder
	for {
		line, err := s.out.ReadString('\n')
		if strings.TrimSpace(line) == mark {
			return out.String()
		}
		out.WriteString(line)
		if err != nil {
			s.t.Fatalf("sqlite3 on A ended: %v\n%s", err, out.String())
		}
	}
}

// close ends the shell (closing its database) and waits for it.
func (s *sqliteShell) close() {
	if s.in != nil {
		s.in.Close()
		s.cmd.Wait()
		s.in = nil
	}
}

// mapsShm tells whether process pid has a database's index (-shm) mapped.
func mapsShm(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	return err == nil && bytes.Contains(b, []byte("-shm"))
}

// sqliteOnce runs one sqlite3 process on db: its output and whether it
// succeeded.
func sqliteOnce(db, script string) (string, bool) {
	cmd := exec.Command("sqlite3", "-bail", db)
	cmd.Stdin = strings.NewReader(".timeout 120000\n" + script)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

func TestSQLiteAcrossClients(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Fatalf("sqlite3 is missing (scripts/setup.sh installs it): %v", err)
	}
	// delete-delegate: with delegations, the readers' shared locks are
	// kept on B (keptlocks.go) and A's writes take them back.
	for _, name := range []string{"delete", "wal", "delete-delegate"} {
		mode, delegate := strings.CutSuffix(name, "-delegate")
		t.Run(name, func(t *testing.T) {
			var args []string
			if delegate {
				args = []string{"--delegate"}
			}
			_, _, url := cacheServer(t, 0, args...)
			a, b := mount(t, url), mount(t, url)
			w := startSqlite(t, filepath.Join(a, "db"))
			if got := strings.TrimSpace(w.do("PRAGMA journal_mode=" + mode + ";")); got != mode {
				t.Fatalf("journal_mode %s: sqlite3 said %q", mode, got)
			}
			w.do("CREATE TABLE t(id INTEGER PRIMARY KEY, c INT, pad BLOB);")
			if delegate {
				w.close()
			}
			var right, failed, wrong int
			for c := 1; c <= sqliteCommits; c++ {
				var s strings.Builder
				s.WriteString("BEGIN;\n")
				for range sqliteRows {
					fmt.Fprintf(&s, "INSERT INTO t(c, pad) VALUES(%d, randomblob(100));\n", c)
				}
				s.WriteString("COMMIT;")
				if delegate {
					// A process a commit: between them A has the
					// database closed, and B's reads are delegated.
					if out, ok := sqliteOnce(filepath.Join(a, "db"), s.String()); !ok {
						t.Fatalf("commit %d on A: %s", c, out)
					}
				} else {
					w.do(s.String())
				}
				// A's commit returned: B's next open of the database
				// sees it, or fails saying why.
				out, ok := sqliteOnce(filepath.Join(b, "db"), "SELECT count(*), max(c) FROM t;\n")
				switch want := fmt.Sprintf("%d|%d", c*sqliteRows, c); {
				case ok && out == want:
					right++
				case !ok && strings.Contains(out, "disk I/O error"):
					if failed++; failed == 1 {
						t.Logf("commit %d: B: %s", c, out)
					}
				default:
					if wrong++; wrong <= 3 {
						t.Errorf("commit %d: B's sqlite3 (exit ok %v) said %q, want %q or a disk I/O error", c, ok, out, want)
					}
				}
			}
			t.Logf("%s: of %d reads on B after A's commits: %d right, %d failed with a disk I/O error, %d wrong", name, sqliteCommits, right, failed, wrong)
			if delegate {
				// B's reads take and let go a shared lock each, at least.
				kept := num(spriteStats(t, b), "locks_kept")
				t.Logf("%s: B's lock calls kept under delegations: %v", name, kept)
				if kept < 2*sqliteCommits {
					t.Errorf("%s: B kept %v lock calls in %d reads: the delegations were not used", name, kept, sqliteCommits)
				}
			}
			if mode == "delete" && right != sqliteCommits {
				t.Errorf("rollback-journal mode: %d of %d reads on B right, want all", right, sqliteCommits)
			}
			// Once A closed the database, B has it to itself: every
			// row, in either mode.
			w.close()
			want := fmt.Sprintf("%d|%d\nok", sqliteCommits*sqliteRows, sqliteCommits)
			if out, ok := sqliteOnce(filepath.Join(b, "db"), "SELECT count(*), max(c) FROM t;\nPRAGMA integrity_check;\n"); !ok || out != want {
				t.Errorf("after A closed the database, B's sqlite3 (exit ok %v) said %q, want %q", ok, out, want)
			}
		})
	}
	t.Run("wal-writers", sqliteWALWriters)
}

// sqliteWALWriters is the case: a writer on each client, both in
// WAL mode at once. Every transaction a writer saw commit is in the
// database; a writer that could not map the index failed saying so.
func sqliteWALWriters(t *testing.T) {
	_, _, url := cacheServer(t, 0)
	dbs := []string{filepath.Join(mount(t, url), "db"), filepath.Join(mount(t, url), "db")}
	if out, ok := sqliteOnce(dbs[0], "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, w INT, n INT, pad BLOB);\n"); !ok {
		t.Fatal(out)
	}
	const txns = 2000
	type result struct {
		out string
		ok  bool
	}
	res := make(chan result, 2)
	for w, db := range dbs {
		var s strings.Builder
		for i := range txns {
			fmt.Fprintf(&s, "BEGIN IMMEDIATE;\nINSERT INTO t(w, n, pad) VALUES(%d, %d, randomblob(200));\nCOMMIT;\n", w, i)
		}
		cmd := exec.Command("sqlite3", "-bail", db)
		cmd.Stdin = strings.NewReader(".timeout 120000\n" + s.String())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			err := cmd.Wait()
			close(done)
			res <- result{strings.TrimSpace(out.String()), err == nil}
		}()
		// The second starts once the first has mapped the index (or
		// ended): an open of it by the second before that would make
		// it write-shared, and the first's mapping would fail too.
		for w == 0 && !mapsShm(cmd.Process.Pid) {
			select {
			case <-done:
			case <-time.After(10 * time.Millisecond):
				continue
			}
			break
		}
	}
	succeeded := 0
	for range 2 {
		r := <-res
		switch {
		case r.ok:
			succeeded++
		case strings.Contains(r.out, "disk I/O error"):
			t.Logf("a writer failed: %s", r.out)
		default:
			t.Errorf("a writer failed without a disk I/O error: %q", r.out)
		}
	}
	// Each writer that succeeded has all its rows; the other has those
	// it committed before it failed, in order. The database is whole.
	if succeeded == 0 {
		t.Error("both writers failed: the first, which mapped the index alone, should not")
	}
	out, ok := sqliteOnce(dbs[0], "SELECT w, count(*), count(DISTINCT n), max(n)+1 FROM t GROUP BY w;\nPRAGMA integrity_check;\n")
	t.Logf("%d of 2 writers succeeded; by writer: rows, distinct, max+1: %q", succeeded, out)
	lines := strings.Split(out, "\n")
	if !ok || lines[len(lines)-1] != "ok" {
		t.Fatalf("the database after both writers: %q (exit ok %v)", out, ok)
	}
	full := 0
	for _, l := range lines[:len(lines)-1] {
		var w, rows, distinct, next int
		if _, err := fmt.Sscanf(l, "%d|%d|%d|%d", &w, &rows, &distinct, &next); err != nil || rows != distinct || rows != next {
			t.Errorf("writer rows %q: want rows 0 to n-1, each once", l)
		}
		if rows == txns {
			full++
		}
	}
	if full < succeeded {
		t.Errorf("%d writers succeeded but %d have all %d rows: rows lost", succeeded, full, txns)
	}
}
