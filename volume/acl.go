package volume

import (
	"encoding/binary"
	"syscall"
)

// POSIX ACLs are extended attributes in Linux's form (system.posix_acl_*:
// a version, then tag, permissions and id per entry). The kernel enforces
// them (fuseview enables FUSE's POSIX ACLs) and asks the file system to
// keep them and the mode in step, as a local file system does: an access
// ACL sets the mode's bits, a chmod sets the ACL's, and a directory's
// default ACL becomes a new child's ACLs in place of the umask.
const (
	aclAccess  = "system.posix_acl_access"
	aclDefault = "system.posix_acl_default"

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

type acl []aclEntry

// parseACL reads an ACL in the xattr form; EINVAL if it is not one.
func parseACL(b []byte) (acl, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 || binary.LittleEndian.Uint32(b) != 2 {
		return nil, syscall.EINVAL
	}
	var a acl
	for p := b[4:]; len(p) > 0; p = p[8:] {
		a = append(a, aclEntry{binary.LittleEndian.Uint16(p), binary.LittleEndian.Uint16(p[2:]), binary.LittleEndian.Uint32(p[4:])})
	}
	return a, nil
}

func (a acl) bytes() []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range a {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// groupClass is the entry that stands for the mode's group bits: the mask
// if there is one, else the owning group's.
func (a acl) groupClass() int {
	g := -1
	for i, e := range a {
		switch e.tag {
		case aclMask:
			return i
		case aclGroupObj:
			g = i
		}
	}
	return g
}

// mode is the permission bits the ACL gives (owner, group class, other).
func (a acl) mode() uint32 {
	var m uint32
	for i, e := range a {
		switch {
		case e.tag == aclUserObj:
			m |= uint32(e.perm&7) << 6
		case i == a.groupClass():
			m |= uint32(e.perm&7) << 3
		case e.tag == aclOther:
			m |= uint32(e.perm & 7)
		}
	}
	return m
}

// minimal says the ACL says no more than a mode: no named entries.
func (a acl) minimal() bool {
	for _, e := range a {
		if e.tag != aclUserObj && e.tag != aclGroupObj && e.tag != aclOther {
			return false
		}
	}
	return true
}

// chmod sets the ACL's owner, group class and other permissions to
// mode's, as chmod(2) does.
func (a acl) chmod(mode uint32) acl {
	return a.withClasses(mode, func(_, m uint16) uint16 { return m })
}

// inherit is the access ACL a new object made with mode gets from its
// directory's default ACL: the entries, with owner, group class and
// other permissions limited to mode's (Linux's posix_acl_create).
func (a acl) inherit(mode uint32) acl {
	return a.withClasses(mode, func(p, m uint16) uint16 { return p & m })
}

// withClasses is a copy of a whose owner, group class and other
// permissions are set(perm, mode's bits of that class).
func (a acl) withClasses(mode uint32, set func(perm, m uint16) uint16) acl {
	out := append(acl(nil), a...)
	g := out.groupClass()
	for i := range out {
		switch {
		case out[i].tag == aclUserObj:
			out[i].perm = set(out[i].perm, uint16(mode>>6&7))
		case i == g:
			out[i].perm = set(out[i].perm, uint16(mode>>3&7))
		case out[i].tag == aclOther:
			out[i].perm = set(out[i].perm, uint16(mode&7))
		}
	}
	return out
}
