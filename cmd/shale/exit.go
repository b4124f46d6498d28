package main

// Exit statuses, one per class of failure, so that scripts can tell them
// apart (docs/admin.md lists them; keep the two in step).

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/crypt"
)

const (
	exitFailure    = 1 // any failure not listed below
	exitUsage      = 2 // the command line: unknown command, flag or option, wrong arguments
	exitLower      = 3 // LOWER: missing, not a directory, not readable
	exitMountpoint = 4 // MOUNTPOINT: missing, not a directory, not empty, mounted already, inside LOWER
	exitMount      = 5 // the kernel or fusermount3 refused the mount: /dev/fuse, allow_other
	exitPassphrase = 6 // crypt: wrong or missing passphrase
)

// exitError is an error with the exit status of its class.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode gives err the exit status code, unless it has one; nil stays
// nil.
func withCode(code int, err error) error {
	var e *exitError
	if err == nil || errors.As(err, &e) {
		return err
	}
	return &exitError{code, err}
}

// exitCode is the exit status of a failure with err.
func exitCode(err error) int {
	var e *exitError
	switch {
	case errors.As(err, &e):
		return e.code
	case errors.Is(err, crypt.ErrWrongPassphrase):
		return exitPassphrase
	}
	return exitFailure
}

// The ready pipe of a background mount (daemonize) carries a failure as
// "exit N: MESSAGE", so that the parent exits as the child would have.
func encodeFailure(err error) string {
	return fmt.Sprintf("exit %d: %v", exitCode(err), err)
}

func decodeFailure(s string) error {
	if rest, ok := strings.CutPrefix(s, "exit "); ok {
		if n, msg, ok := strings.Cut(rest, ": "); ok {
			if code, err := strconv.Atoi(n); err == nil {
				return withCode(code, errors.New(msg))
			}
		}
	}
	return errors.New(s)
}

// usageErrors makes the command line's errors that cobra finds, bad flags
// and wrong numbers of arguments, exit with exitUsage.
func usageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return withCode(exitUsage, err)
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				return withCode(exitUsage, args(cmd, a))
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
