package conformance

import (
	"encoding/binary"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// Modes of new objects: the caller's mode, masked by its umask or, in a
// directory with a default ACL, by the ACL instead. The suite runs every
// case under several umasks (TestConformance); this case also varies the
// umask of another user within one run.

// POSIX ACL xattr encoding (linux/posix_acl_xattr.h).
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclMask     = 0x10
	aclOther    = 0x20
)

// acl encodes entries {tag, perm, id} as a system.posix_acl_* value.
func acl(entries ...[3]uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, en := range entries {
		id := en[2]
		if en[0] != aclUser {
			id = 0xffffffff
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(en[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(en[1]))
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

var _ = addCases(
	testCase{"modes", func(t *testing.T, e *env) {
		newObjects := func(dir string) {
			for _, m := range []uint32{0o620, 0o666, 0o777, 0o4777, 0o2775, 0o1644} {
				fd, err := unix.Open(e.P(dir, "f"+modeName(m)), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, m)
				e.Must(err, "create %o", m)
				unix.Close(fd)
			}
			for _, m := range []uint32{0o777, 0o755, 0o1777, 0o2770} {
				e.Must(unix.Mkdir(e.P(dir, "d"+modeName(m)), m), "mkdir %o", m)
			}
			e.Must(unix.Mkfifo(e.P(dir, "fifo"), 0o666), "mkfifo")
			e.Must(unix.Mknod(e.P(dir, "sock"), unix.S_IFSOCK|0o777, 0), "mknod")
			e.Must(unix.Symlink("target", e.P(dir, "link")), "symlink")
		}
		e.Mkdir("plain", 0o755)
		newObjects("plain")
		e.Tree("as root", "plain")

		// A default ACL decides instead of the umask, and is inherited.
		e.Mkdir("acl", 0o755)
		e.Must(unix.Setxattr(e.P("acl"), "system.posix_acl_default", acl(
			[3]uint32{aclUserObj, 7}, [3]uint32{aclUser, 7, 65534}, [3]uint32{aclGroupObj, 5},
			[3]uint32{aclMask, 7}, [3]uint32{aclOther, 5}), 0), "set default ACL")
		newObjects("acl")
		e.Tree("as root under a default ACL", "acl")
		for _, name := range []string{"f0666", "d0777"} {
			for _, x := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
				buf := make([]byte, 256)
				n, err := unix.Getxattr(e.P("acl", name), x, buf)
				if err != nil {
					e.Errno(name+" "+x, err)
				} else {
					e.Note(name+" "+x, buf[:n])
				}
			}
		}

		// Another user, under each umask, in a directory it owns.
		e.Mkdir("nobody", 0o755)
		e.Must(unix.Chown(e.P("nobody"), 65534, 65534), "chown")
		for _, m := range []string{"0", "0o002", "0o022", "0o077"} {
			p := e.P("nobody", "u"+m)
			e.NoteAs("nobody umask "+m, nobody,
				[]string{"umask", m},
				[]string{"mkdir", p, "0o777"},
				[]string{"create", p + "/f", "0o666"},
				[]string{"create", p + "/x", "0o4775"},
				[]string{"mkfifo", p + "/p", "0o660"},
				[]string{"stat", p},
				[]string{"stat", p + "/f"},
				[]string{"stat", p + "/x"},
				[]string{"stat", p + "/p"},
			)
		}

		// An access ACL grants what the mode bits alone would not.
		e.WriteFile("granted", "g", 0o600)
		e.Must(unix.Setxattr(e.P("granted"), "system.posix_acl_access", acl(
			[3]uint32{aclUserObj, 6}, [3]uint32{aclUser, 4, 65534}, [3]uint32{aclGroupObj, 0},
			[3]uint32{aclMask, 4}, [3]uint32{aclOther, 0}), 0), "set access ACL")
		e.Stat("granted", "granted")
		r := e.Nobody([]string{"read", e.P("granted")}, []string{"write", e.P("granted"), "x"})
		e.Expect("nobody reads through the ACL", r[0], `OK "g"`)
		e.Expect("nobody may not write", r[1], "EACCES")
	}},
)

func modeName(m uint32) string { return fmt.Sprintf("%04o", m) }
