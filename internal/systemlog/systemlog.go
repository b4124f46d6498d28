// Package systemlog sends a process's slog records to the system's log,
// as a daemon's should go: to the journal in journald's native protocol
// where systemd runs, else to syslog (RFC 3164 over a unix datagram
// socket, as log/syslog writes it), one datagram a record.
package systemlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// The sockets a system's log listens on.
const (
	JournalSocket = "/run/systemd/journal/socket"
	SyslogSocket  = "/dev/log"
)

// Protocols of Dial.
const (
	Journal = "journal" // journald's native protocol
	Syslog  = "syslog"  // RFC 3164, as to /dev/log
)

// ErrNone says that neither the journal's socket nor syslog's exists.
var ErrNone = errors.New("no journal (" + JournalSocket + ") or syslog (" + SyslogSocket + ") socket")

// Open connects to the system's log: the journal if its socket exists,
// else syslog. It returns the handler and what it connected to.
func Open(tag string, level slog.Leveler) (slog.Handler, string, error) {
	for _, s := range []struct{ proto, path string }{{Journal, JournalSocket}, {Syslog, SyslogSocket}} {
		if _, err := os.Stat(s.path); err == nil {
			h, err := Dial(s.proto, s.path, tag, level)
			return h, s.proto + ":" + s.path, err
		}
	}
	return nil, "", ErrNone
}

// Dial connects to the log socket at path, which speaks proto (Journal
// or Syslog). Records are tagged tag (SYSLOG_IDENTIFIER) and below level
// dropped.
func Dial(proto, path, tag string, level slog.Leveler) (slog.Handler, error) {
	if proto != Journal && proto != Syslog {
		return nil, fmt.Errorf("log protocol %q: say %s or %s", proto, Journal, Syslog)
	}
	s := &sink{proto: proto, path: path, tag: tag, pid: os.Getpid()}
	if err := s.dial(); err != nil {
		return nil, err
	}
	// The message comes first, as its own; time and level are the log's.
	text := slog.NewTextHandler(&s.attrs, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
				return slog.Attr{}
			}
			return a
		},
	})
	return &handler{s, text}, nil
}

// sink is the connection one logger and the loggers derived from it
// (With) share; mu serializes records through attrs and conn.
type sink struct {
	proto, path, tag string
	pid              int

	mu    sync.Mutex
	conn  net.Conn
	attrs bytes.Buffer // a record's attributes, as the text handler wrote them
}

func (s *sink) dial() error {
	c, err := net.Dial("unixgram", s.path)
	if err != nil {
		return fmt.Errorf("system log %s: %v", s.path, err)
	}
	s.conn = c
	return nil
}

type handler struct {
	s    *sink
	text slog.Handler // formats the attributes into s.attrs
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.text.Enabled(ctx, l) }

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{h.s, h.text.WithAttrs(as)}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{h.s, h.text.WithGroup(name)}
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attrs.Reset()
	if err := h.text.Handle(ctx, r); err != nil {
		return err
	}
	msg := r.Message
	if a := strings.TrimSpace(s.attrs.String()); a != "" {
		msg += " " + a
	}
	b := s.format(priority(r.Level), msg)
	if _, err := s.conn.Write(b); err != nil {
		// The log restarted (its socket is new): once more, anew.
		s.conn.Close()
		if err := s.dial(); err != nil {
			return err
		}
		_, err = s.conn.Write(b)
		return err
	}
	return nil
}

// facility is LOG_DAEMON.
const facility = 3

// priority is syslog's severity of l.
func priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3 // err
	case l >= slog.LevelWarn:
		return 4 // warning
	case l >= slog.LevelInfo:
		return 6 // info
	}
	return 7 // debug
}

// format is one record's datagram.
func (s *sink) format(prio int, msg string) []byte {
	var b bytes.Buffer
	if s.proto == Syslog {
		// As log/syslog writes to a local socket: no host name.
		fmt.Fprintf(&b, "<%d>%s %s[%d]: %s\n", facility*8+prio, time.Now().Format(time.Stamp), s.tag, s.pid, msg)
		return b.Bytes()
	}
	field := func(k, v string) {
		if !strings.Contains(v, "\n") {
			fmt.Fprintf(&b, "%s=%s\n", k, v)
			return
		}
		// A value with newlines: its length, little-endian, then itself.
		b.WriteString(k + "\n")
		binary.Write(&b, binary.LittleEndian, uint64(len(v)))
		b.WriteString(v + "\n")
	}
	field("MESSAGE", msg)
	field("PRIORITY", fmt.Sprint(prio))
	field("SYSLOG_FACILITY", fmt.Sprint(facility))
	field("SYSLOG_IDENTIFIER", s.tag)
	field("SYSLOG_PID", fmt.Sprint(s.pid))
	return b.Bytes()
}
