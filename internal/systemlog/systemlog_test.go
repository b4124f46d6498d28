package systemlog

import (
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// listen is a log socket at a test's path; it returns the datagrams.
func listen(t *testing.T) (string, func() string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "log.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return path, func() string {
		b := make([]byte, 1<<16)
		c.SetReadDeadline(time.Now().Add(time.Minute))
		n, err := c.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		return string(b[:n])
	}
}

func TestJournal(t *testing.T) {
	path, next := listen(t)
	h, err := Dial(Journal, path, "shale", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	l := slog.New(h).With("mountpoint", "/mnt/a b")
	l.Debug("dropped")
	l.Warn("changes show late", "err", "line one\nline two")
	l.Error("two\nlines")
	got := next()
	for _, want := range []string{
		`MESSAGE=changes show late mountpoint="/mnt/a b" err="line one\nline two"` + "\n",
		"PRIORITY=4\n", "SYSLOG_IDENTIFIER=shale\n", "SYSLOG_PID=",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("journal datagram %q lacks %q", got, want)
		}
	}
	// A message with a newline in it: its length, then itself.
	msg := "two\nlines mountpoint=\"/mnt/a b\""
	want := "MESSAGE\n" + string([]byte{byte(len(msg)), 0, 0, 0, 0, 0, 0, 0}) + msg + "\nPRIORITY=3\n"
	if got := next(); !strings.HasPrefix(got, want) {
		t.Errorf("journal datagram %q, want it to begin %q", got, want)
	}
}

func TestSyslog(t *testing.T) {
	path, next := listen(t)
	h, err := Dial(Syslog, path, "shale", slog.LevelDebug)
	if err != nil {
		t.Fatal(err)
	}
	slog.New(h).Info("mounted", "layer", 1)
	got := next()
	if !regexp.MustCompile(`^<30>\w{3} [ \d]\d \d\d:\d\d:\d\d shale\[\d+\]: mounted layer=1\n$`).MatchString(got) {
		t.Errorf("syslog datagram %q", got)
	}
}
