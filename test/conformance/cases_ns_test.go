package conformance

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func listxattr(path string) (string, error) {
	n, err := unix.Llistxattr(path, nil)
	if err != nil {
		return "", err
	}
	buf := make([]byte, n)
	n, err = unix.Llistxattr(path, buf)
	if err != nil {
		return "", err
	}
	names := strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00")
	slices.Sort(names)
	return strings.Join(names, ","), nil
}

func getxattr(path, name string) string {
	buf := make([]byte, 1<<16)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return errName(err)
	}
	return fmt.Sprintf("%q", buf[:n])
}

var _ = addCases(
	testCase{"xattr", func(t *testing.T, e *env) {
		e.WriteFile("f", "x", 0o644)
		p := e.P("f")
		e.ExpectErrno("set user.a", unix.Setxattr(p, "user.a", []byte("1"), 0), "OK")
		e.ExpectErrno("set user.b", unix.Setxattr(p, "user.b", []byte("hello\x00world"), 0), "OK")
		e.ExpectErrno("set user.empty", unix.Setxattr(p, "user.empty", nil, 0), "OK")
		e.Expect("get user.a", getxattr(p, "user.a"), `"1"`)
		e.Expect("get user.b", getxattr(p, "user.b"), `"hello\x00world"`)
		e.Expect("get user.empty", getxattr(p, "user.empty"), `""`)
		n, err := unix.Getxattr(p, "user.b", nil)
		e.Expect("size query", fmt.Sprint(n, " ", errName(err)), "11 OK")
		_, err = unix.Getxattr(p, "user.b", make([]byte, 3))
		e.ExpectErrno("buffer too small", err, "ERANGE")
		l, err := listxattr(p)
		e.Expect("list", l+" "+errName(err), "user.a,user.b,user.empty OK")
		n, err = unix.Listxattr(p, nil)
		e.Expect("list size query", fmt.Sprint(n, " ", errName(err)), "25 OK")
		_, err = unix.Listxattr(p, make([]byte, 5))
		e.ExpectErrno("list buffer too small", err, "ERANGE")
		e.ExpectErrno("XATTR_CREATE existing", unix.Setxattr(p, "user.a", []byte("2"), unix.XATTR_CREATE), "EEXIST")
		e.ExpectErrno("XATTR_REPLACE missing", unix.Setxattr(p, "user.zz", []byte("2"), unix.XATTR_REPLACE), "ENODATA")
		e.ExpectErrno("XATTR_REPLACE existing", unix.Setxattr(p, "user.a", []byte("22"), unix.XATTR_REPLACE), "OK")
		e.ExpectErrno("XATTR_CREATE new", unix.Setxattr(p, "user.c", []byte("3"), unix.XATTR_CREATE), "OK")
		e.Expect("get replaced", getxattr(p, "user.a"), `"22"`)
		e.ExpectErrno("remove user.a", unix.Removexattr(p, "user.a"), "OK")
		e.Expect("get removed", getxattr(p, "user.a"), "ENODATA")
		e.ExpectErrno("remove missing", unix.Removexattr(p, "user.a"), "ENODATA")
		l, _ = listxattr(p)
		e.Expect("list after", l, "user.b,user.c,user.empty")
		e.ExpectErrno("unknown namespace", unix.Setxattr(p, "bogus.a", []byte("1"), 0), "ENOTSUP")
		e.ExpectErrno("empty name", unix.Setxattr(p, "", []byte("1"), 0), "ERANGE")
		e.ExpectErrno("name of 256 bytes", unix.Setxattr(p, "user."+strings.Repeat("n", 251), []byte("1"), 0), "ERANGE")
		e.ExpectErrno("name of 255 bytes", unix.Setxattr(p, "user."+strings.Repeat("n", 250), []byte("1"), 0), "OK")
		e.ExpectErrno("trusted.* as root", unix.Setxattr(p, "trusted.t", []byte("t"), 0), "OK")
		e.Expect("get trusted.*", getxattr(p, "trusted.t"), `"t"`)
		// Sizes: the largest value ext4 takes without ea_inode is a bit
		// under a block; whatever native allows, shale must too.
		for _, size := range []int{1000, 3000, 4000, 4096, 65536, 65537} {
			v := bytes.Repeat([]byte{'v'}, size)
			err := unix.Setxattr(p, "user.big", v, 0)
			e.Errno(fmt.Sprintf("set %d bytes", size), err)
			if err == nil {
				e.Expect(fmt.Sprintf("get %d bytes", size), getxattr(p, "user.big") == fmt.Sprintf("%q", v), true)
			}
		}
		unix.Removexattr(p, "user.big")
		// The largest value that fits, found natively, must fit on shale.
		lo, hi := 0, 65536
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if unix.Setxattr(p, "user.max", make([]byte, mid), 0) == nil {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		e.Note("largest user.max value", lo)
		e.Must(unix.Removexattr(p, "user.max"), "removexattr")
		// Directories, symlinks, and nobody.
		e.Mkdir("d", 0o755)
		e.ExpectErrno("set on dir", unix.Setxattr(e.P("d"), "user.d", []byte("d"), 0), "OK")
		e.Expect("get on dir", getxattr(e.P("d"), "user.d"), `"d"`)
		e.Must(os.Symlink("f", e.P("l")), "symlink")
		e.ExpectErrno("user.* on a symlink", unix.Lsetxattr(e.P("l"), "user.l", []byte("l"), 0), "EPERM")
		e.Expect("lget user.* on a symlink", getxattr(e.P("l"), "user.l"), "ENODATA")
		l, err = listxattr(e.P("l"))
		e.Expect("llist a symlink", l+" "+errName(err), " OK")
		buf := make([]byte, 100)
		n, err = unix.Getxattr(e.P("l"), "user.b", buf)
		e.Expect("get through a symlink", fmt.Sprintf("%q %s", buf[:max(n, 0)], errName(err)), `"hello\x00world" OK`)
		r := e.Nobody(
			[]string{"setxattr", p, "user.n", "n"},
			[]string{"read", p},
		)
		e.Expect("nobody sets user.* on root's 0644 file", r[0], "EACCES")
		fd := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("fsetxattr", unix.Fsetxattr(fd, "user.fd", []byte("fd"), 0), "OK")
		buf = make([]byte, 10)
		n, err = unix.Fgetxattr(fd, "user.fd", buf)
		e.Expect("fgetxattr", fmt.Sprintf("%q %s", buf[:max(n, 0)], errName(err)), `"fd" OK`)
	}},

	testCase{"names-long", func(t *testing.T, e *env) {
		n255 := strings.Repeat("a", 255)
		n256 := strings.Repeat("b", 256)
		fd, err := unix.Open(e.P(n255), unix.O_CREAT|unix.O_WRONLY, 0o644)
		e.ExpectErrno("create 255", err, "OK")
		unix.Close(fd)
		e.Stat("stat 255", n255)
		_, err = unix.Open(e.P(n256), unix.O_CREAT|unix.O_WRONLY, 0o644)
		e.ExpectErrno("create 256", err, "ENAMETOOLONG")
		e.ExpectErrno("lstat 256", unix.Lstat(e.P(n256), new(unix.Stat_t)), "ENAMETOOLONG")
		e.ExpectErrno("mkdir 256", unix.Mkdir(e.P(n256), 0o755), "ENAMETOOLONG")
		e.ExpectErrno("symlink named 256", unix.Symlink("x", e.P(n256)), "ENAMETOOLONG")
		e.ExpectErrno("link to 256", unix.Link(e.P(n255), e.P(n256)), "ENAMETOOLONG")
		e.ExpectErrno("rename to 256", unix.Rename(e.P(n255), e.P(n256)), "ENAMETOOLONG")
		e.ExpectErrno("mknod 256", unix.Mknod(e.P(n256), unix.S_IFIFO|0o644, 0), "ENAMETOOLONG")
		e.ExpectErrno("unlink 256", unix.Unlink(e.P(n256)), "ENAMETOOLONG")
		// 255 bytes of multi-byte UTF-8 (85 × 3 bytes).
		u := strings.Repeat("€", 85)
		e.ExpectErrno("mkdir 255 bytes of UTF-8", unix.Mkdir(e.P(u), 0o755), "OK")
		e.ExpectErrno("mkdir 258 bytes of UTF-8", unix.Mkdir(e.P(u+"€"), 0o755), "ENAMETOOLONG")
		// Odd but legal names.
		for _, name := range []string{" ", "-", "\n", "a\tb", "\x01", "\xff\xfe", "...", ".a", "a.", "*?[", "\\"} {
			err := os.WriteFile(e.P(name), []byte(name), 0o644)
			e.Errno(fmt.Sprintf("create %q", name), err)
		}
		ents, err := os.ReadDir(e.Root)
		e.Must(err, "readdir")
		var names []string
		for _, d := range ents {
			names = append(names, fmt.Sprintf("%q", d.Name()))
		}
		e.Expect("listing", len(names), 13)
		e.Note("names", strings.Join(names, " "))

		// Symlink targets: up to 4095 bytes.
		t4095 := strings.Repeat("t/", 2047) + "t"
		e.ExpectErrno("symlink 4095", unix.Symlink(t4095, e.P("l4095")), "OK")
		got, err := os.Readlink(e.P("l4095"))
		e.Expect("readlink 4095", fmt.Sprint(len(got), " ", got == t4095, " ", errName(err)), "4095 true OK")
		var lst unix.Stat_t
		err = unix.Lstat(e.P("l4095"), &lst)
		e.Expect("lstat size", fmt.Sprint(lst.Size, " ", errName(err)), "4095 OK")
		e.ExpectErrno("symlink 4096", unix.Symlink(t4095+"x", e.P("l4096")), "ENAMETOOLONG")
		buf := make([]byte, 10)
		n, err := unix.Readlink(e.P("l4095"), buf)
		e.Expect("readlink into a short buffer", fmt.Sprintf("%d %q %s", n, buf[:max(n, 0)], errName(err)), `10 "t/t/t/t/t/" OK`)
		e.ExpectErrno("readlink a file", func() error { _, err := os.Readlink(e.P(n255)); return err }(), "EINVAL")
		e.ExpectErrno("empty symlink target", unix.Symlink("", e.P("empty")), "ENOENT")
		// A path through many symlinks.
		e.Must(os.Symlink(".", e.P("dot")), "symlink")
		e.ExpectErrno("40 symlinks deep", unix.Access(e.P(strings.Repeat("dot/", 40)+n255), unix.F_OK), "OK")
		e.ExpectErrno("41 symlinks deep", unix.Access(e.P(strings.Repeat("dot/", 41)+n255), unix.F_OK), "ELOOP")
		e.Must(os.Symlink("loop", e.P("loop")), "symlink")
		_, err = os.ReadFile(e.P("loop"))
		e.ExpectErrno("self loop", err, "ELOOP")
	}},

	testCase{"special-files", func(t *testing.T, e *env) {
		e.ExpectErrno("mkfifo", unix.Mkfifo(e.P("fifo"), 0o640), "OK")
		e.ExpectErrno("mknod socket", unix.Mknod(e.P("sock"), unix.S_IFSOCK|0o600, 0), "OK")
		e.ExpectErrno("mknod chardev", unix.Mknod(e.P("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))), "OK")
		e.ExpectErrno("mknod blockdev", unix.Mknod(e.P("blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))), "OK")
		e.ExpectErrno("mknod big dev numbers", unix.Mknod(e.P("bigdev"), unix.S_IFCHR|0o600, int(unix.Mkdev(4000, 1<<19))), "OK")
		e.ExpectErrno("mknod regular", unix.Mknod(e.P("reg"), unix.S_IFREG|0o600, 0), "OK")
		e.ExpectErrno("mknod bad type", unix.Mknod(e.P("bad"), 0o170000|0o600, 0), "EINVAL")
		e.ExpectErrno("mknod over existing", unix.Mkfifo(e.P("fifo"), 0o640), "EEXIST")
		for _, n := range []string{"fifo", "sock", "null", "blk", "bigdev", "reg"} {
			e.Stat("stat "+n, n)
		}
		// The fifo works (O_RDWR never blocks on Linux).
		fd, err := unix.Open(e.P("fifo"), unix.O_RDWR|unix.O_NONBLOCK, 0)
		e.ExpectErrno("open fifo", err, "OK")
		if err == nil {
			unix.Write(fd, []byte("through the fifo"))
			buf := make([]byte, 100)
			n, _ := unix.Read(fd, buf)
			e.Expect("fifo data", string(buf[:max(n, 0)]), "through the fifo")
			unix.Close(fd)
		}
		// The char device (1,3) is /dev/null, unless the mount is nodev
		// (as shale's are, like every FUSE mount by default).
		var sfs unix.Statfs_t
		e.Must(unix.Statfs(e.Root, &sfs), "statfs")
		wantOpen := "OK"
		if sfs.Flags&unix.ST_NODEV != 0 {
			wantOpen = "EACCES"
		}
		fd, err = unix.Open(e.P("null"), unix.O_WRONLY, 0)
		e.Expect("open chardev: OK, or EACCES on a nodev mount", errName(err) == wantOpen, true)
		if err == nil {
			unix.Close(fd)
		}
		// A socket bound in the directory is reachable by its path.
		ln, err := net.Listen("unix", e.P("bound"))
		e.ExpectErrno("bind unix socket", err, "OK")
		if err == nil {
			defer ln.Close()
			e.Stat("stat bound socket", "bound")
			go func() {
				c, err := ln.Accept()
				if err == nil {
					c.Write([]byte("hi"))
					c.Close()
				}
			}()
			c, err := net.Dial("unix", e.P("bound"))
			e.ExpectErrno("connect", err, "OK")
			if err == nil {
				buf := make([]byte, 10)
				n, _ := c.Read(buf)
				e.Expect("socket data", string(buf[:n]), "hi")
				c.Close()
			}
		}
		_, err = net.Dial("unix", e.P("sock"))
		e.ExpectErrno("connect to a mknod'ed socket", err, "ECONNREFUSED")
		e.ExpectErrno("bind over existing", func() error { _, err := net.Listen("unix", e.P("fifo")); return err }(), "EADDRINUSE")
		r := e.Nobody([]string{"stat", e.P("null")}, []string{"read", e.P("blk")})
		e.Note("nobody", strings.Join(r, " | "))
	}},
)
