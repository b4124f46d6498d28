package coherence

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sqliteTxns is how many transactions each writer commits.
const sqliteTxns = 2000

// TestSQLiteWAL runs one SQLite writer in each of two views of one layer,
// on one database in WAL mode. WAL's index (the -shm file) is a shared
// mapping that both processes store into and read from without any
// system call, so every store through one view must be seen at once
// through the other: the two views must share the kernel's pages.
func TestSQLiteWAL(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Fatalf("sqlite3 is missing (scripts/setup.sh installs it): %v", err)
	}
	_, m := mountViews(t, "on", 0, 0, 1, 1)
	for _, pair := range []struct {
		name string
		a, b string
	}{{"loop", m[0], m[1]}, {"crypt", m[2], m[3]}} {
		t.Run(pair.name, func(t *testing.T) {
			sqliteWriters(t, filepath.Join(pair.a, "db"), filepath.Join(pair.b, "db"))
		})
	}
}

func sqliteWriters(t *testing.T, a, b string) {
	sqlite(t, a, "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, w INT, n INT, seen INT, pad BLOB);\n")
	// Each transaction reads what the other writer committed (seen), so
	// a stale index shows as errors or lost rows, not only as a count.
	script := func(w int) string {
		var s strings.Builder
		s.WriteString(".timeout 120000\nPRAGMA synchronous=NORMAL;\n")
		for i := 0; i < sqliteTxns; i++ {
			fmt.Fprintf(&s, "BEGIN IMMEDIATE;\nINSERT INTO t(w, n, seen, pad) VALUES(%d, %d, (SELECT count(*) FROM t), randomblob(200));\nCOMMIT;\n", w, i)
		}
		return s.String()
	}
	errs := make(chan error, 2)
	for w, db := range []string{a, b} {
		go func() { errs <- sqliteRun(db, script(w)) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	want := fmt.Sprintf("%d|%d|%d|ok", 2*sqliteTxns, 2*sqliteTxns, 2*sqliteTxns)
	check := "SELECT count(*), count(DISTINCT w*1000000+n), max(seen)+1 FROM t;\nPRAGMA integrity_check;\n"
	for _, db := range []string{a, b} {
		got := strings.ReplaceAll(strings.TrimSpace(sqlite(t, db, check)), "\n", "|")
		if got != want {
			t.Errorf("%s: rows, distinct rows, rows seen by the last transaction, integrity: got %q, want %q", db, got, want)
		}
	}
}

// sqlite runs script on db and returns its output; any error fails t.
func sqlite(t *testing.T, db, script string) string {
	t.Helper()
	out, err := sqliteOut(db, script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sqliteRun(db, script string) error {
	_, err := sqliteOut(db, script)
	return err
}

func sqliteOut(db, script string) (string, error) {
	// A hang guard only: the work is bounded by the transaction count.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sqlite3", "-bail", db)
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("sqlite3 %s: %v: %s", db, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
