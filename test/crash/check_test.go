package crash

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// observed is what a walk of the mount found.
type observed struct {
	tree tree
	ino  map[string]uint64 // by path; "." is the root
	errs map[string]error  // what failed to list, stat, read or readlink
}

// observe walks the whole mount: lists every directory, reads every file
// fully and reads every symlink.
func observe(mnt string) observed {
	o := observed{tree: tree{}, ino: map[string]uint64{}, errs: map[string]error{}}
	var st unix.Stat_t
	if err := unix.Lstat(mnt, &st); err != nil {
		o.errs["."] = err
		return o
	}
	o.ino["."] = st.Ino
	var walk func(rel string)
	walk = func(rel string) {
		ents, err := os.ReadDir(filepath.Join(mnt, rel))
		if err != nil {
			o.errs[rel] = err
			return
		}
		for _, e := range ents {
			p := path.Join(rel, e.Name())
			full := filepath.Join(mnt, p)
			fi, err := os.Lstat(full)
			if err != nil {
				o.errs[p] = err
				continue
			}
			o.ino[p] = fi.Sys().(*syscall.Stat_t).Ino
			switch {
			case fi.Mode().IsRegular():
				data, err := os.ReadFile(full)
				if err != nil {
					o.errs[p] = err
				}
				o.tree[p] = node{kind: file, data: data}
			case fi.IsDir():
				o.tree[p] = node{kind: dir, managed: fi.Mode()&os.ModeSetuid != 0}
				walk(p)
			case fi.Mode()&os.ModeSymlink != 0:
				target, err := os.Readlink(full)
				if err != nil {
					o.errs[p] = err
				}
				o.tree[p] = node{kind: link, target: target}
			default:
				o.errs[p] = fmt.Errorf("unexpected file type %v", fi.Mode())
			}
		}
	}
	walk(".")
	return o
}

// checkCrash checks the lower directory, then the remounted tree against
// cur, the tree the completed ops made, and inFlight, the op the kill
// interrupted. It returns the tree to go on from.
func checkCrash(t *testing.T, st stack, lower, mnt string, cur tree, inFlight *op) tree {
	t.Helper()
	obs := observe(mnt)
	// Below first: a file with torn blocks is removed further on.
	for _, p := range checkLower(lower, obs, st.rules) {
		t.Errorf("lower directory: %s", p)
	}
	var dc *dataChange
	if inFlight != nil {
		dc = inFlight.data
	}
	for p, err := range obs.errs {
		if dc == nil || p != dc.path {
			t.Errorf("%s: %v", short(p), short(err.Error()))
		}
	}
	next := cur
	switch {
	case inFlight == nil:
		report(t, "after a kill between operations", cur.diff(obs.tree))
	case dc == nil:
		// The op is done or not, whole.
		if d := cur.diff(obs.tree); len(d) != 0 {
			next = inFlight.next
			if d2 := next.diff(obs.tree); len(d2) != 0 {
				report(t, "after a kill during "+inFlight.desc+", the tree is neither the one before it nor the one after; against the one before", d)
				report(t, "against the one after", d2)
			}
		}
	default:
		next = checkData(t, st, mnt, cur, obs, inFlight)
	}
	return next
}

func report(t *testing.T, what string, diffs []string) {
	t.Helper()
	if len(diffs) == 0 {
		return
	}
	if len(diffs) > 20 {
		diffs = append(diffs[:20], fmt.Sprintf("… and %d more", len(diffs)-20))
	}
	t.Errorf("%s:\n\t%s", what, strings.Join(diffs, "\n\t"))
}

// checkData checks the tree after a kill during a write or truncate: all
// but the file it changed is as before, and that file holds, byte by
// byte, the old or the new contents within the range the op rewrote and
// the old ones outside it, with a size between the old and the new. With
// tornBlocks, blocks of that range may fail to read; such a file is
// removed, as a user would restore it.
func checkData(t *testing.T, st stack, mnt string, cur tree, obs observed, o *op) tree {
	t.Helper()
	dc := o.data
	want, got := cur.clone(), obs.tree.clone()
	delete(want, dc.path)
	delete(got, dc.path)
	report(t, "after a kill during "+o.desc+", other files", want.diff(got))
	n, ok := obs.tree[dc.path]
	if !ok || n.kind != file {
		t.Errorf("after a kill during %s, the file is gone (%v)", o.desc, n)
		return obs.tree
	}
	full := filepath.Join(mnt, dc.path)
	data, bad := n.data, map[int]bool{}
	if err := obs.errs[dc.path]; err != nil {
		if !st.tornBlocks || !errors.Is(err, syscall.EIO) {
			t.Errorf("after a kill during %s, reading the file: %v", o.desc, err)
			return obs.tree
		}
		var rerr error
		if data, bad, rerr = readBlocks(full); rerr != nil {
			t.Errorf("after a kill during %s, reading the file block by block: %v", o.desc, rerr)
			return obs.tree
		}
	}
	newData := o.next[dc.path].data
	at := func(b []byte, i int) byte {
		if i < len(b) {
			return b[i]
		}
		return 0
	}
	if l := len(data); l < min(len(dc.old), len(newData)) || l > max(len(dc.old), len(newData)) {
		t.Errorf("after a kill during %s, the file has %d bytes, want %d to %d", o.desc, l, min(len(dc.old), len(newData)), max(len(dc.old), len(newData)))
	}
	for b := range bad {
		if b < dc.lo/blockSize || b > (dc.hi-1)/blockSize {
			t.Errorf("after a kill during %s, block %d fails to read, outside the blocks the op rewrote (%d to %d)", o.desc, b, dc.lo/blockSize, (dc.hi-1)/blockSize)
		}
	}
	for i, c := range data {
		switch {
		case bad[i/blockSize]:
		case i < dc.lo || i >= dc.hi:
			if c != at(dc.old, i) {
				t.Errorf("after a kill during %s, byte %d, outside the range the op rewrote, changed", o.desc, i)
				return obs.tree
			}
		case c != at(dc.old, i) && c != at(newData, i):
			t.Errorf("after a kill during %s, byte %d is neither the old nor the new one", o.desc, i)
			return obs.tree
		}
	}
	next := cur.clone()
	if len(bad) > 0 {
		blocks := make([]int, 0, len(bad))
		for b := range bad {
			blocks = append(blocks, b)
		}
		sort.Ints(blocks)
		t.Logf("after a kill during %s: blocks %v fail to read (allowed within the blocks it was rewriting, docs/crash-safety.md); removing the file", o.desc, blocks)
		if err := os.Remove(full); err != nil {
			t.Errorf("removing a file with torn blocks: %v", err)
		}
		delete(next, dc.path)
		return next
	}
	next[dc.path] = node{kind: file, data: data}
	return next
}

// readBlocks reads the file one block at a time, with readahead off so
// that a block that fails to read fails only its own read. Bad blocks
// read as zeros in data.
func readBlocks(p string) (data []byte, bad map[int]bool, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	data, bad = make([]byte, fi.Size()), map[int]bool{}
	for off := 0; off < len(data); off += blockSize {
		blk := data[off:min(off+blockSize, len(data))]
		k, err := f.ReadAt(blk, int64(off))
		switch {
		case errors.Is(err, syscall.EIO):
			bad[off/blockSize] = true
			clear(blk)
		case err != nil:
			return nil, nil, err
		case k != len(blk):
			return nil, nil, fmt.Errorf("short read of %d bytes at %d", k, off)
		}
	}
	return data, bad, nil
}

// lowerRules lists the entries of lower directory d that are entries
// above (as lower paths; a managed shard directory's are in its buckets)
// and reports what is wrong with the layer's own files in it.
type lowerRules func(d string, st *unix.Stat_t, root bool) (entries, problems []string)

// checkLower walks the lower directory with the layer's rules and checks
// that each directory holds, by inode, exactly the entries the mount
// showed in it: none hidden, none missing.
func checkLower(lower string, obs observed, rules lowerRules) []string {
	up := map[uint64]map[uint64]string{}
	for p, n := range obs.tree {
		if n.kind == dir {
			up[obs.ino[p]] = map[uint64]string{}
		}
	}
	up[obs.ino["."]] = map[uint64]string{}
	for p, ino := range obs.ino {
		if p != "." {
			up[obs.ino[path.Dir(p)]][ino] = p
		}
	}
	low := map[uint64]map[uint64]string{}
	var problems []string
	rel := func(p string) string {
		r, _ := filepath.Rel(lower, p)
		return short(r)
	}
	var walk func(d string, st *unix.Stat_t, root bool)
	walk = func(d string, st *unix.Stat_t, root bool) {
		entries, probs := rules(d, st, root)
		for _, p := range probs {
			problems = append(problems, rel(d)+": "+p)
		}
		kids := map[uint64]string{}
		low[st.Ino] = kids
		for _, e := range entries {
			var est unix.Stat_t
			if err := unix.Lstat(e, &est); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", rel(e), err))
				continue
			}
			kids[est.Ino] = e
			if est.Mode&unix.S_IFMT == unix.S_IFDIR {
				walk(e, &est, false)
			}
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(lower, &st); err != nil {
		return []string{err.Error()}
	}
	walk(lower, &st, true)
	for dino, kids := range low {
		above, ok := up[dino]
		if !ok {
			continue // a directory that is itself hidden, reported below
		}
		for ino, p := range kids {
			if _, ok := above[ino]; !ok {
				problems = append(problems, fmt.Sprintf("%s: not shown through the mount", rel(p)))
			}
		}
	}
	for dino, above := range up {
		kids := low[dino]
		for ino, p := range above {
			if _, ok := kids[ino]; !ok {
				problems = append(problems, fmt.Sprintf("%s (through the mount): not found where the layer keeps it below", short(p)))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func names(d string) ([]string, error) {
	f, err := os.Open(d)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// plainRules: loop and rot13 keep no files of their own.
func plainRules(d string, st *unix.Stat_t, root bool) (entries, problems []string) {
	ns, err := names(d)
	if err != nil {
		return nil, []string{err.Error()}
	}
	for _, n := range ns {
		entries = append(entries, filepath.Join(d, n))
	}
	return entries, nil
}

// The wrap template's files of a layer that encodes names and links
// (wrap/names.go), and crypt's (crypt/dirid.go, crypt/config.go).
const (
	dirIDFile     = ".shale.dirid"
	dirIDSize     = 16
	longPrefix    = ".shale.L."
	sidecarSuffix = ".name"
	linkPrefix    = ".shale.T." // a long symlink target's sidecar, in the root
	configFile    = "shale.conf"
)

// cryptRules: every directory holds a 16-byte directory ID; every
// stand-in of a long name has its sidecar, holding the encoded name whose
// hash names the stand-in, and every sidecar its stand-in. (A symlink
// whose target's sidecar is missing fails readlink through the mount.)
func cryptRules(d string, st *unix.Stat_t, root bool) (entries, problems []string) {
	ns, err := names(d)
	if err != nil {
		return nil, []string{err.Error()}
	}
	has := map[string]bool{}
	for _, n := range ns {
		has[n] = true
	}
	if !has[dirIDFile] {
		problems = append(problems, "no directory ID ("+dirIDFile+"): names in it can be neither made nor shown")
	}
	for _, n := range ns {
		full := filepath.Join(d, n)
		switch {
		case n == dirIDFile:
			if id, err := os.ReadFile(full); err != nil || len(id) != dirIDSize {
				problems = append(problems, fmt.Sprintf("directory ID of %d bytes (%v), want %d", len(id), err, dirIDSize))
			}
		case root && n == configFile:
		case strings.HasPrefix(n, longPrefix) && strings.HasSuffix(n, sidecarSuffix):
			standIn := strings.TrimSuffix(n, sidecarSuffix)
			if !has[standIn] {
				problems = append(problems, "orphan long-name sidecar "+short(n)+": its stand-in is gone")
				continue
			}
			enc, err := os.ReadFile(full)
			sum := sha256.Sum256(enc)
			if err != nil || longPrefix+base64.RawURLEncoding.EncodeToString(sum[:]) != standIn {
				problems = append(problems, fmt.Sprintf("sidecar %s does not hold the name of its stand-in (%d bytes, %v)", short(n), len(enc), err))
			}
		case root && strings.HasPrefix(n, linkPrefix):
			// A long symlink target's sidecar. One left by a kill between
			// it and its symlink, or between the symlink's removal and
			// its own, is harmless: hidden, never read, and named by
			// the hash of a target encrypted under a fresh nonce, which
			// never recurs (docs/crash-safety.md).
		case strings.HasPrefix(n, longPrefix):
			if !has[n+sidecarSuffix] {
				problems = append(problems, "stand-in "+short(n)+" has no sidecar")
			}
			entries = append(entries, full)
		case strings.HasPrefix(n, "."):
			problems = append(problems, "unexpected lower name "+short(n))
		default:
			entries = append(entries, full)
		}
	}
	return entries, problems
}

// shard's bucket layout (shard/bucket.go): 1024 buckets .shard-000 to
// .shard-3ff; NAME lives in bucket xxhash64(NAME) >> 54.
const bucketPrefix = ".shard-"

func bucketOf(name string) string {
	return fmt.Sprintf("%s%03x", bucketPrefix, xxhash.Sum64String(name)>>54)
}

// shardRules: a managed directory (setuid) holds only buckets, with its
// owner, group and mode less the setuid bit, each holding only the names
// that hash to it; strays (a conversion the crash interrupted) must be
// gone once the walk through the mount has used the directory.
func shardRules(d string, st *unix.Stat_t, root bool) (entries, problems []string) {
	if st.Mode&unix.S_ISUID == 0 {
		return plainRules(d, st, root)
	}
	ns, err := names(d)
	if err != nil {
		return nil, []string{err.Error()}
	}
	wantMode := st.Mode & 0o7777 &^ unix.S_ISUID
	for _, n := range ns {
		full := filepath.Join(d, n)
		var bst unix.Stat_t
		if err := unix.Lstat(full, &bst); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if !isBucketName(n) || bst.Mode&unix.S_IFMT != unix.S_IFDIR {
			problems = append(problems, "stray "+short(n)+" beside the buckets, after the directory was used")
			entries = append(entries, full)
			continue
		}
		if bst.Mode&0o7777 != wantMode || bst.Uid != st.Uid || bst.Gid != st.Gid {
			problems = append(problems, fmt.Sprintf("bucket %s has mode %04o and owner %d:%d, want %04o and %d:%d", n, bst.Mode&0o7777, bst.Uid, bst.Gid, wantMode, st.Uid, st.Gid))
		}
		kids, err := names(full)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, k := range kids {
			if b := bucketOf(k); b != n {
				problems = append(problems, fmt.Sprintf("%s is in bucket %s, belongs in %s", short(k), n, b))
			}
			entries = append(entries, filepath.Join(full, k))
		}
	}
	return entries, problems
}

func isBucketName(n string) bool {
	b, err := strconv.ParseUint(strings.TrimPrefix(n, bucketPrefix), 16, 16)
	return err == nil && b < 1024 && n == fmt.Sprintf("%s%03x", bucketPrefix, b)
}
