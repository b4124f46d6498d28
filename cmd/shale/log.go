package main

// Where a serving process logs (--log, --log-level): one slog logger,
// which the stack's parts get through stack.Spec.Logger and the rest
// through slog's default.

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/statedir"
	"github.com/shalefs/shale/internal/systemlog"
)

// registerLog adds --log and --log-level to fl; def says where the log
// goes without --log.
func (f *mountFlags) registerLog(fl *pflag.FlagSet, def string) {
	fl.StringVar(&f.logFile, "log", "", "where the log goes: a FILE to append to, stderr, syslog (the journal where systemd runs, else /dev/log), journal:SOCKET or syslog:SOCKET (default: "+def+")")
	fl.StringVar(&f.logLevel, "log-level", "info", "the least level logged: debug, info, warn or error")
}

// logTag is the name the system's log knows shale by.
const logTag = "shale"

// openLog makes the serving process's logger, by --log; background says
// there is no standard error to log to.
func openLog(f *mountFlags, background bool) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--log-level %s: say debug, info, warn or error", f.logLevel))
	}
	where := f.logFile
	if where == "" {
		where = "stderr"
		if background {
			where = "syslog"
		}
	}
	var h slog.Handler
	proto, sock, _ := strings.Cut(where, ":")
	switch {
	case where == "stderr" || where == "-":
		h = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	case where == "syslog":
		var err error
		if h, _, err = systemlog.Open(logTag, level); err != nil {
			return fallbackLog(level, err)
		}
	case (proto == systemlog.Journal || proto == systemlog.Syslog) && filepath.IsAbs(sock):
		var err error
		if h, err = systemlog.Dial(proto, sock, logTag, level); err != nil {
			return nil, fmt.Errorf("--log %s: %v", where, err)
		}
	default:
		lf, err := os.OpenFile(where, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("log file %s: %v", where, err)
		}
		if f.debug {
			// go-fuse's request log goes to stderr.
			unix.Dup2(int(lf.Fd()), 2)
		}
		h = slog.NewTextHandler(lf, &slog.HandlerOptions{Level: level})
	}
	return setLog(h), nil
}

// fallbackLogMax is the size past which the fallback log is moved to
// shale.log.1 (replacing the one before) when a process opens it: nothing
// else rotates it.
const fallbackLogMax = 16 << 20

// fallbackLog is the log of a background process on a machine with no
// system log to send it to: a file in the state directory, which the log
// names in its first line.
func fallbackLog(level slog.Level, why error) (*slog.Logger, error) {
	path := filepath.Join(statedir.Dir(), "shale.log")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if fi, err := os.Stat(path); err == nil && fi.Size() > fallbackLogMax {
		os.Rename(path, path+".1")
	}
	var w io.Writer = io.Discard
	if lf, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
		w = lf
	}
	l := setLog(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	l.Info("logging to "+path, "why", why)
	return l, nil
}

// setLog makes h the logger of every part: the stack's through
// stack.Spec.Logger, and the few without one (p9net, objstore, compress)
// through slog's default.
func setLog(h slog.Handler) *slog.Logger {
	l := slog.New(h)
	slog.SetDefault(l)
	return l
}
