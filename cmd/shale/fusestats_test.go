package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fuseStats asks shale stats --json for mnt's counters.
func fuseStats(t *testing.T, mnt string) mountReply {
	t.Helper()
	code, out := run(t, "stats", "--json", mnt)
	var r mountReply
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
		t.Fatalf("shale stats --json: exit %d, %v:\n%s", code, err, out)
	}
	if r.Fuse == nil || r.Coherence == nil {
		t.Fatalf("shale stats --json has no FUSE or coherence counters:\n%s", out)
	}
	return r
}

// TestFuseStats: shale stats of a local mount counts the FUSE requests
// its kernel sent, by type, the lookups that found nothing and the
// negative entries kept and dropped, and the coherence callbacks of a
// change made beside the stack; --metrics serves the same counters.
func TestFuseStats(t *testing.T) {
	_, lower, mnt := lowerAndMnt(t)
	addr := freePort(t)
	if code, out := run(t, "mount", "--metrics", addr, lower, mnt); code != 0 {
		t.Fatalf("shale mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	before := fuseStats(t, mnt)

	const missing, statfs = 5, 3
	for i := range missing {
		if _, err := os.Stat(filepath.Join(mnt, "missing"+strconv.Itoa(i))); !os.IsNotExist(err) {
			t.Fatalf("stat of a missing name: %v", err)
		}
	}
	for range statfs {
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "d", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Rmdir(filepath.Join(mnt, "d")); err != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a directory with a file: %v", err)
	}
	after := fuseStats(t, mnt)
	req := func(r mountReply, op string) (n, errs uint64) {
		return r.Fuse.Requests[op].Count, r.Fuse.Requests[op].Errors
	}
	for _, c := range []struct {
		op      string
		n, errs uint64
	}{{"LOOKUP", missing + 1, 0}, {"STATFS", statfs, 0}, {"MKDIR", 1, 0}, {"CREATE", 1, 0}, {"RMDIR", 1, 1}} {
		n0, e0 := req(before, c.op)
		n1, e1 := req(after, c.op)
		if n1-n0 < c.n || e1-e0 < c.errs {
			t.Errorf("%s: %d requests, %d errors after the test's, want at least %d and %d", c.op, n1-n0, e1-e0, c.n, c.errs)
		}
		if after.Fuse.Requests[c.op].Nanos == 0 {
			t.Errorf("%s: no time counted", c.op)
		}
	}
	if n := after.Fuse.Missing - before.Fuse.Missing; n < missing {
		t.Errorf("%d lookups of no such name, want at least %d", n, missing)
	}
	if n := after.Fuse.NegativeKept - before.Fuse.NegativeKept; n < missing {
		t.Errorf("%d negative entries kept, want at least %d", n, missing)
	}

	// A name the kernel holds as missing, made beside the stack: an
	// event of the watch, a callback to the view and a dropped entry.
	if err := os.WriteFile(filepath.Join(lower, "missing0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := fuseStats(t, mnt)
		f, c := r.Fuse, r.Coherence
		if f.NegativeDropped > before.Fuse.NegativeDropped && f.Invalidations["entry"] > before.Fuse.Invalidations["entry"] &&
			f.Callbacks > before.Fuse.Callbacks && c.Beside > before.Coherence.Beside && c.Events["entries"] > before.Coherence.Events["entries"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a change beside the stack is not counted after 30s: %+v, coherence %+v", *f, *c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(mnt, "missing0")); err != nil {
		t.Errorf("the name made beside the stack: %v", err)
	}

	code, out := run(t, "stats", mnt)
	for _, want := range []string{"\nFUSE requests ", "\n  STATFS ", "\n  LOOKUP ", "\nlookups ", "\ncallbacks ", "\ncoherence "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("shale stats: exit %d, no %q:\n%s", code, want, out)
		}
	}
	m := get(t, "http://"+addr+"/metrics")
	rx := regexp.MustCompile(`(?m)^shale_fuse_requests_total\{mountpoint="` + regexp.QuoteMeta(mnt) + `",op="STATFS"\} (\d+)$`)
	if s := rx.FindStringSubmatch(m); s == nil {
		t.Errorf("metrics have no STATFS requests of %s:\n%s", mnt, grep(m, "shale_fuse"))
	} else if n, _ := strconv.ParseUint(s[1], 10, 64); n < statfs {
		t.Errorf("metrics: %d STATFS requests, want at least %d", n, statfs)
	}
	for _, want := range []string{"shale_fuse_negative_kept_total{", `shale_coherence_events_total{kind="entries"}`, "shale_coherence_beside_total "} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics have no %s:\n%s", want, grep(m, "shale_"))
		}
	}
}
