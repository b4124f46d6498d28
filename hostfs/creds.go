package hostfs

import (
	"context"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// asCaller runs fn with the thread's fsuid and fsgid set to the caller's,
// so that what fn creates belongs to the caller and gets its group the way
// the lower file system decides (e.g. from a setgid directory).
const secbitNoSetuidFixup = 1 << 2

func (fs *FS) asCaller(ctx context.Context, fn func() error) error {
	c, ok := layer.CallerOf(ctx)
	if !fs.asRoot || !ok || (c.Uid == 0 && c.Gid == 0) {
		return fn()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The kernel has already checked the caller's permissions
	// (default_permissions); the switch is only to give new objects the
	// right owner and group. SECBIT_NO_SETUID_FIXUP keeps root's file
	// capabilities across it, so the lower file system does not check
	// again without the caller's supplementary groups. All of these act on
	// the calling thread only.
	syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0)
	syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(c.Gid), 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(c.Uid), 0, 0)
	defer func() {
		syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSGID, 0, 0, 0)
	}()
	return fn()
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
