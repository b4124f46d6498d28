package conformance

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// A caller's gid and supplementary groups, as pjdfstest's C suite runs
// them (`-u 65534 -g 65533,65532`, chown/00 and the new file's group in
// mkdir, mkfifo and open 00): groups the system's user database does not
// give the user, so that a 9P server that looks the user's groups up
// itself (diod; shale serve before its credentials protocol) differs.

// member is uid 65534 with gid 65533 and the supplementary groups 65533
// and 65532, neither of them in the user database.
var member = &cred{uid: 65534, gid: 65533, groups: []uint32{65533, 65532}}

var _ = addCases(
	testCase{"perm-groups", func(t *testing.T, e *env) {
		e.WriteFile("own", "o", 0o644)
		e.Must(os.Chown(e.P("own"), 65534, 65534), "chown")
		e.WriteFile("grpread", "g", 0o640)
		e.Must(os.Chown(e.P("grpread"), 0, 65532), "chown")
		// The group class wins over the other class: a member is denied.
		e.WriteFile("grpdeny", "d", 0o604)
		e.Must(os.Chown(e.P("grpdeny"), 0, 65532), "chown")
		e.Mkdir("gwdir", 0o770)
		e.Must(os.Chown(e.P("gwdir"), 0, 65532), "chown")
		e.Mkdir("sgdir", 0o2770)
		e.Must(os.Chown(e.P("sgdir"), 0, 65532), "chown")
		steps := []struct{ what, want string }{
			{"chown own to a supplementary group", "OK"},
			{"stat", "OK file 0644 uid=65534 gid=65532 nlink=1 size=1"},
			{"chown own to the gid", "OK"},
			{"chown own to a group not ours", "EPERM"},
			{"chmod g+s own, in its group", "OK"},
			{"stat: setgid kept", "OK file 2644 uid=65534 gid=65533 nlink=1 size=1"},
			{"read 0640 by group", `OK "g"`},
			{"read 0604 as a member of its group", "EACCES"},
			{"write 0604 as a member of its group", "EACCES"},
			{"create in a group-writable dir", "OK"},
			{"stat: the gid's group", "OK file 0644 uid=65534 gid=65533 nlink=1 size=0"},
			{"mkdir in a group-writable dir", "OK"},
			{"stat: the gid's group", "OK dir 0755 uid=65534 gid=65533 nlink=2"},
			{"mkfifo in a group-writable dir", "OK"},
			{"stat: the gid's group", "OK fifo 0644 uid=65534 gid=65533 nlink=1 size=0"},
			{"create in a setgid dir", "OK"},
			{"stat: the dir's group", "OK file 0644 uid=65534 gid=65532 nlink=1 size=0"},
			{"mkdir in a setgid dir", "OK"},
			{"stat: the dir's group, setgid", "OK dir 2755 uid=65534 gid=65532 nlink=2"},
			{"create 2755 in a setgid dir, in its group", "OK"},
			{"stat: setgid kept", "OK file 2755 uid=65534 gid=65532 nlink=1 size=0"},
			{"rename within a group-writable dir", "OK"},
			{"unlink in a group-writable dir", "OK"},
		}
		r := e.As(member,
			[]string{"chown", e.P("own"), "-1", "65532"},
			[]string{"stat", e.P("own")},
			[]string{"chown", e.P("own"), "-1", "65533"},
			[]string{"chown", e.P("own"), "-1", "65531"},
			[]string{"chmod", e.P("own"), "0o2644"},
			[]string{"stat", e.P("own")},
			[]string{"read", e.P("grpread")},
			[]string{"read", e.P("grpdeny")},
			[]string{"write", e.P("grpdeny"), "x"},
			[]string{"create", e.P("gwdir/f"), "0o644"},
			[]string{"stat", e.P("gwdir/f")},
			[]string{"mkdir", e.P("gwdir/d"), "0o755"},
			[]string{"stat", e.P("gwdir/d")},
			[]string{"mkfifo", e.P("gwdir/p"), "0o644"},
			[]string{"stat", e.P("gwdir/p")},
			[]string{"create", e.P("sgdir/f"), "0o644"},
			[]string{"stat", e.P("sgdir/f")},
			[]string{"mkdir", e.P("sgdir/d"), "0o755"},
			[]string{"stat", e.P("sgdir/d")},
			[]string{"create", e.P("sgdir/s"), "0o2755"},
			[]string{"stat", e.P("sgdir/s")},
			[]string{"rename", e.P("gwdir/f"), e.P("gwdir/g")},
			[]string{"unlink", e.P("gwdir/g")},
		)
		for i, s := range steps {
			e.Expect("member "+itoa(i)+" "+s.what, r[i], s.want)
		}
		e.Tree("tree", ".")
	}},

	// chmod/12's: a write by a non-owner clears setuid, and setgid with
	// group execute (here through the writer's supplementary group).
	testCase{"perm-groups-write-clears-setid", func(t *testing.T, e *env) {
		e.WriteFile("sgid", "s", 0o644)
		e.Must(os.Chown(e.P("sgid"), 0, 65532), "chown")
		e.Must(unix.Chmod(e.P("sgid"), 0o6770), "chmod")
		r := e.As(member, []string{"write", e.P("sgid"), "x"}, []string{"stat", e.P("sgid")})
		e.Expect("member writes 6770 root:65532", r[0], "OK")
		e.Expect("stat: setuid and setgid cleared", r[1], "OK file 0770 uid=0 gid=65532 nlink=1 size=1")
	}},
)
