package hostfs

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// Credentials are per thread in Linux, so a request runs as its caller on
// a locked thread whose fsuid, fsgid, groups and capabilities are switched
// with raw system calls, which act on the calling thread only (Go's
// syscall.Setgroups and Setuid change every thread of the process, through
// AllThreadsSyscall). Threads serve other goroutines once unlocked, so the
// thread is restored to the process's own credentials before that.
//
// Two modes share that switch (as):
//
//   - Without Caller.Check (FUSE with default_permissions) the kernel has
//     already checked the caller's permissions, and operations run as root.
//     Only creating operations switch, fsuid and fsgid alone, to give new
//     objects the caller as owner and the group the lower file system
//     decides (e.g. a setgid directory's); root's capabilities stay
//     (SECBIT_NO_SETUID_FIXUP), so the lower file system does not check
//     again without the caller's supplementary groups.
//   - With Check (9P) nothing has checked, and every operation on the host
//     switches fully: fsuid, fsgid, the caller's groups and, unless the
//     caller is root, an empty effective capability set. The host kernel
//     then checks the operation as it would for a local program of that
//     user. Clearing the effective set, rather than relying on the fixup
//     that drops CAP_DAC_OVERRIDE & co when fsuid leaves 0, also drops
//     CAP_SYS_ADMIN (trusted.* and security.* xattrs), CAP_SETFCAP (file
//     capabilities) and CAP_SYS_RESOURCE (quotas, reserved blocks); and it
//     does not depend on the securebits an earlier switch of the thread
//     left.
//
// Shale not running as root cannot switch: with Check it serves only its
// own user (a caller whose uid is not its euid gets EACCES), with its own
// groups.

const secbitNoSetuidFixup = 1 << 2

// procCreds are the process's own credentials, to restore a thread to.
type procCreds struct {
	groups []uint32
	caps   [2]unix.CapUserData // _LINUX_CAPABILITY_VERSION_3: two words
}

// ownCreds reads the calling thread's credentials, which are the
// process's: no thread is switched outside as.
func ownCreds() (procCreds, error) {
	var pc procCreds
	gs, err := unix.Getgroups()
	if err != nil {
		return pc, fmt.Errorf("getgroups: %w", err)
	}
	for _, g := range gs {
		pc.groups = append(pc.groups, uint32(g))
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &pc.caps[0]); err != nil {
		return pc, fmt.Errorf("capget: %w", err)
	}
	return pc, nil
}

// asCaller runs fn, which makes an object, as the caller ctx carries.
func (fs *FS) asCaller(ctx context.Context, fn func() error) error {
	return fs.as(ctx, true, fn)
}

// checked runs fn, which acts on the host, as the caller if the caller
// asks for Check, and as the process otherwise.
func (fs *FS) checked(ctx context.Context, fn func() error) error {
	return fs.as(ctx, false, fn)
}

// checking tells whether ctx's caller asks for Check.
func checking(ctx context.Context) bool {
	c, _ := layer.CallerOf(ctx)
	return c.Check
}

// as runs fn with the credentials ctx's caller needs; makes says that fn
// creates an object.
func (fs *FS) as(ctx context.Context, makes bool, fn func() error) error {
	c, ok := layer.CallerOf(ctx)
	switch {
	case !ok:
		return fn()
	case c.Check && !fs.asRoot:
		if c.Uid != fs.euid {
			return syscall.EACCES
		}
		return fn()
	case !c.Check && (!makes || !fs.asRoot || (c.Uid == 0 && c.Gid == 0)):
		return fn()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var sw switched
	defer fs.restore(&sw)
	if err := fs.become(&c, &sw); err != nil {
		return err
	}
	return fn()
}

// switched is what become changed besides fsuid and fsgid, for restore.
type switched struct {
	groups, caps bool
}

// become gives the locked thread c's credentials, noting in sw what
// restore must undo. Each change commits new credentials, about a
// microsecond, so what is already right is left alone.
func (fs *FS) become(c *layer.Caller, sw *switched) error {
	if !c.Check {
		syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0)
		syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(c.Gid), 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(c.Uid), 0, 0)
		return nil
	}
	// Failing to become the caller fails the operation: running it with
	// more of our credentials than the caller has would skip checks.
	gs, err := c.Groups()
	if err != nil {
		return syscall.EACCES
	}
	if !slices.Equal(gs, fs.own.groups) {
		sw.groups = true
		if setgroups(gs) != nil {
			return syscall.EACCES // e.g. a user namespace that denies setgroups
		}
	}
	// setfsuid and setfsgid report no errors; an id the user namespace
	// does not map is silently refused, so read the ids back (-1 changes
	// nothing and returns the current one).
	syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(c.Gid), 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(c.Uid), 0, 0)
	g, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, ^uintptr(0), 0, 0)
	u, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
	if uint32(g) != c.Gid || uint32(u) != c.Uid {
		return syscall.EACCES
	}
	if c.Uid != 0 {
		caps := fs.own.caps
		caps[0].Effective, caps[1].Effective = 0, 0
		sw.caps = true
		if capset(&caps) != nil {
			return syscall.EACCES
		}
	}
	return nil
}

// restore gives the locked thread the process's credentials back, undoing
// what become did or tried, in the order that keeps the capabilities each
// step needs (CAP_SETUID for setfsuid, CAP_SETGID for setgroups). The
// kernel would raise the file system capabilities again when fsuid
// returns to 0 without SECBIT_NO_SETUID_FIXUP, but capset restores the
// whole set whatever the securebits. Setting fsuid or fsgid to what it
// already is commits nothing and costs little.
func (fs *FS) restore(sw *switched) {
	if sw.caps {
		if err := capset(&fs.own.caps); err != nil {
			poisoned("capabilities", err)
		}
	}
	syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSGID, 0, 0, 0)
	if sw.groups {
		if err := setgroups(fs.own.groups); err != nil {
			poisoned("groups", err)
		}
	}
}

// poisoned stops on a thread that cannot be restored. The extra lock
// outlives as's unlock, so that even if the panic is recovered the thread
// never serves another goroutine; the runtime ends it with this one.
func poisoned(what string, err error) {
	runtime.LockOSThread()
	panic(fmt.Sprintf("hostfs: cannot restore the thread's %s: %v", what, err))
}

// setgroups sets the calling thread's supplementary groups, and only its.
func setgroups(gs []uint32) error {
	var p unsafe.Pointer
	if len(gs) > 0 {
		p = unsafe.Pointer(&gs[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), uintptr(p), 0); e != 0 {
		return e
	}
	return nil
}

// capset sets the calling thread's capabilities, and only its.
func capset(caps *[2]unix.CapUserData) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	return unix.Capset(&hdr, &caps[0])
}

// newMode is the mode to create name's object with in the directory dirfd:
// the caller's mode masked by its umask, unless the directory has a default
// ACL, which the lower file system then applies instead, as it would for a
// local program. The process's own umask is 0 (New), so nothing masks twice.
func newMode(ctx context.Context, dirfd int, mode uint32) uint32 {
	c, _ := layer.CallerOf(ctx)
	if c.Umask&0o7777 == 0 {
		return mode
	}
	if _, err := unix.Getxattr(procPath(dirfd), "system.posix_acl_default", nil); err == nil {
		return mode
	}
	return mode &^ (c.Umask & 0o777)
}
