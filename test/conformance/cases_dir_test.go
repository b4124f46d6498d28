package conformance

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

type dirent struct {
	off  int64
	typ  uint8
	name string
}

// getdents reads one batch of entries from fd with a buffer of size bytes.
func getdents(fd, size int) ([]dirent, error) {
	buf := make([]byte, size)
	n, err := unix.Getdents(fd, buf)
	if err != nil {
		return nil, err
	}
	var out []dirent
	for b := buf[:n]; len(b) > 0; {
		reclen := binary.NativeEndian.Uint16(b[16:18])
		name := b[19:reclen]
		out = append(out, dirent{
			off:  int64(binary.NativeEndian.Uint64(b[8:16])),
			typ:  b[18],
			name: string(name[:slices.Index(name, 0)]),
		})
		b = b[reclen:]
	}
	return out, nil
}

var dtNames = map[uint8]string{unix.DT_REG: "reg", unix.DT_DIR: "dir", unix.DT_LNK: "lnk", unix.DT_FIFO: "fifo", unix.DT_SOCK: "sock", unix.DT_CHR: "chr", unix.DT_BLK: "blk", unix.DT_UNKNOWN: "unknown"}

var _ = addCases(
	testCase{"readdir-delete-while-open", func(t *testing.T, e *env) {
		const n = 1000
		e.Mkdir("d", 0o755)
		for i := 0; i < n; i++ {
			fd, err := unix.Open(e.P(fmt.Sprintf("d/f%04d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			e.Must(err, "create")
			unix.Close(fd)
		}
		dir, err := os.Open(e.P("d"))
		e.Must(err, "opendir")
		defer dir.Close()
		first, err := dir.Readdirnames(100)
		e.Must(err, "readdir")
		for i := 0; i < n; i += 2 {
			e.Must(unix.Unlink(e.P(fmt.Sprintf("d/f%04d", i))), "unlink")
		}
		rest, err := dir.Readdirnames(-1)
		e.Must(err, "readdir")
		seen := map[string]int{}
		for _, name := range append(first, rest...) {
			seen[name]++
		}
		dups, missing := 0, 0
		for name, c := range seen {
			if c > 1 {
				dups++
				t.Logf("%s: %s seen %d times", e.Name, name, c)
			}
		}
		for i := 1; i < n; i += 2 {
			if seen[fmt.Sprintf("f%04d", i)] == 0 {
				missing++
			}
		}
		e.Expect("entries seen twice", dups, 0)
		e.Expect("surviving entries not seen", missing, 0)
		// Which deleted entries show up is the file system's business.
		names, err := os.ReadDir(e.P("d"))
		e.Must(err, "readdir")
		var got []string
		for _, d := range names {
			got = append(got, d.Name())
		}
		var want []string
		for i := 1; i < n; i += 2 {
			want = append(want, fmt.Sprintf("f%04d", i))
		}
		e.Expect("fresh listing", strings.Join(got, ","), strings.Join(want, ","))
		e.Expect("dir nlink", e.MustStat("d").Nlink, uint64(2))
	}},

	testCase{"readdir-offsets-types", func(t *testing.T, e *env) {
		e.Mkdir("d", 0o755)
		for i := 0; i < 200; i++ {
			e.Must(os.WriteFile(e.P(fmt.Sprintf("d/file%03d", i)), nil, 0o644), "create")
		}
		e.Mkdir("d/sub", 0o755)
		e.Must(os.Symlink("x", e.P("d/link")), "symlink")
		e.Must(unix.Mkfifo(e.P("d/fifo"), 0o644), "mkfifo")
		e.Must(unix.Mknod(e.P("d/sock"), unix.S_IFSOCK|0o644, 0), "mknod")
		e.Must(unix.Mknod(e.P("d/chr"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))), "mknod")
		fd := e.Fd("d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		var all []dirent
		for {
			ents, err := getdents(fd, 1024)
			e.Must(err, "getdents")
			if len(ents) == 0 {
				break
			}
			all = append(all, ents...)
		}
		types := map[string]string{}
		for _, d := range all {
			if !strings.HasPrefix(d.name, "file") {
				types[d.name] = dtNames[d.typ]
			}
		}
		e.Expect("entries", len(all), 207)
		e.Expect("d_type", fmt.Sprint(types), "map[.:dir ..:dir chr:chr fifo:fifo link:lnk sock:sock sub:dir]")
		// Seeking to an entry's d_off continues after that entry.
		ok := true
		for _, k := range []int{0, 1, 50, 150, 205} {
			_, err := unix.Seek(fd, all[k].off, unix.SEEK_SET)
			e.Must(err, "seek")
			ents, err := getdents(fd, 1024)
			e.Must(err, "getdents")
			if len(ents) == 0 || ents[0].name != all[k+1].name {
				ok = false
				t.Logf("%s: after seeking to d_off of entry %d (%s) got %v, want %s", e.Name, k, all[k].name, ents[:min(len(ents), 1)], all[k+1].name)
			}
		}
		e.Expect("seek to d_off continues after the entry", ok, true)
		_, err := unix.Seek(fd, all[len(all)-1].off, unix.SEEK_SET)
		e.Must(err, "seek")
		ents, err := getdents(fd, 1024)
		e.Expect("after the last d_off", fmt.Sprint(len(ents), " ", errName(err)), "0 OK")
		_, err = unix.Seek(fd, 0, unix.SEEK_SET)
		e.Must(err, "rewind")
		ents, err = getdents(fd, 1024)
		e.Must(err, "getdents")
		e.Expect("rewind restarts", len(ents) > 0 && ents[0].name == all[0].name, true)
		// Offsets stay valid across deletions: remove entries before and
		// after a saved offset, then seek to it.
		k := 100
		for _, i := range []int{10, 20, 99, 101, 120} {
			if strings.HasPrefix(all[i].name, "file") {
				e.Must(unix.Unlink(e.P("d", all[i].name)), "unlink")
			}
		}
		_, err = unix.Seek(fd, all[k].off, unix.SEEK_SET)
		e.Must(err, "seek")
		var after []string
		for {
			ents, err := getdents(fd, 1024)
			e.Must(err, "getdents")
			if len(ents) == 0 {
				break
			}
			for _, d := range ents {
				after = append(after, d.name)
			}
		}
		var want []string
		for i := k + 1; i < len(all); i++ {
			if i != 101 && i != 120 || !strings.HasPrefix(all[i].name, "file") {
				want = append(want, all[i].name)
			}
		}
		// A layer that changes names lists in another order: compare with
		// this file system's own order, and record only the verdict.
		e.Expect("entries after a saved offset, with deletions around it", strings.Join(after, ",") == strings.Join(want, ","), true)
		// Any regular file that survived the deletions (listing orders
		// differ between layers).
		e.WriteFile("plain", "x", 0o644)
		_, err = getdents(e.Fd("plain", unix.O_RDONLY, 0), 1024)
		e.ExpectErrno("getdents on a file", err, "ENOTDIR")
	}},

	testCase{"statfs", func(t *testing.T, e *env) {
		var s unix.Statfs_t
		e.ExpectErrno("statfs", unix.Statfs(e.Root, &s), "OK")
		e.Expect("namelen", s.Namelen, int64(255))
		e.Expect("bsize > 0", s.Bsize > 0, true)
		e.Expect("blocks > 0", s.Blocks > 0, true)
		e.Expect("bavail <= bfree <= blocks", s.Bavail <= s.Bfree && s.Bfree <= s.Blocks, true)
		e.Expect("ffree <= files", s.Files > 0 && s.Ffree <= s.Files, true)
		e.Expect("frsize", s.Frsize, s.Bsize)
		// Native and shale's lower directory are on the same file system.
		e.Note("bsize", s.Bsize)
		e.Note("blocks", s.Blocks)
		e.Note("files", s.Files)
		e.Note("read-only", s.Flags&unix.ST_RDONLY != 0)
		e.WriteFile("f", "x", 0o644)
		var f unix.Statfs_t
		e.ExpectErrno("fstatfs", unix.Fstatfs(e.Fd("f", unix.O_RDONLY, 0), &f), "OK")
		e.Expect("fstatfs agrees", f.Blocks == s.Blocks && f.Namelen == s.Namelen, true)
		e.ExpectErrno("statfs missing", unix.Statfs(e.P("nope"), &f), "ENOENT")
		// Space used shows up in bfree.
		before := s.Bfree
		fd := e.Fd("big", unix.O_RDWR|unix.O_CREAT, 0o644)
		e.Must(unix.Fallocate(fd, 0, 0, 64<<20), "fallocate")
		e.Must(unix.Statfs(e.Root, &s), "statfs")
		e.Expect("64 MiB allocated shows in bfree", before-s.Bfree >= (60<<20)/uint64(s.Bsize), true)
	}},
)
