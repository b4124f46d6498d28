package main

// Where mount(2) is not allowed (not root), go-fuse mounts through the
// setuid fusermount3, which says why it failed on this process's standard
// error, and go-fuse then only that it "exited with code 256". A
// background mount's standard error is /dev/null; in the foreground the
// reason is a second line. Either way the one error line should carry it.

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// fusermountReason runs mount with standard error caught, and returns its
// error with the reason fusermount3 gave, and what to do about it, in
// place of go-fuse's words. What else was written meanwhile (a
// foreground mount's log) is passed on to standard error.
func fusermountReason(mount func() error) error {
	r, w, err := os.Pipe()
	if err != nil {
		return mount()
	}
	saved, err := unix.FcntlInt(2, unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		r.Close()
		w.Close()
		return mount()
	}
	unix.Dup2(int(w.Fd()), 2)
	w.Close() // fd 2 holds the pipe now; when it is restored, EOF
	caught := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		caught <- string(b)
	}()
	merr := mount()
	unix.Dup2(saved, 2)
	unix.Close(saved)
	out := <-caught
	var reason string
	for _, line := range strings.Split(out, "\n") {
		if _, after, ok := strings.Cut(line, "fusermount3: "); ok {
			reason = after
			continue
		}
		if line != "" {
			os.Stderr.WriteString(line + "\n")
		}
	}
	if merr == nil || reason == "" {
		return merr
	}
	return withCode(exitMount, fmt.Errorf("fusermount3: %s%s", reason, fusermountHint(reason)))
}

// fusermountHint says what to do about the reasons most users meet.
func fusermountHint(reason string) string {
	switch {
	case strings.Contains(reason, "/dev/fuse"):
		return fmt.Sprintf(": uid %d may not open /dev/fuse; make it mode 0666 (as Debian's udev rule does), or mount as root", os.Geteuid())
	case strings.Contains(reason, "user_allow_other"):
		return ": add a line user_allow_other to /etc/fuse.conf, or mount without --allow-other (allow_other)"
	case strings.Contains(reason, "no write access to mountpoint"):
		return fmt.Sprintf(": uid %d must own the mountpoint, or may write to it", os.Geteuid())
	case strings.Contains(reason, "mount_max"):
		return ": raise mount_max in /etc/fuse.conf, or unmount some"
	}
	return ""
}
