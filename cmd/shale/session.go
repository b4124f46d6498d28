package main

// The state of a mount's 9P session, as shale status shows it: connected
// or not, since when, how often it was lost and restored, and the last
// error. remote/session keeps none of it to be asked, but logs each
// change; sessionWatch reads those lines as the logger passes them on.

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// The lines remote/session logs as its connection comes and goes
// (TestStatus fails if they change).
const (
	msgLost     = "9p connection lost"     // Warn, with err
	msgRestored = "9p connection restored" // Info
	msgRedial   = "9p redial"              // Debug, with err: why a dial failed
)

// sessionState is a mount's 9P session, in shale status --json.
type sessionState struct {
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since"` // connected or lost since
	Losses    uint64    `json:"losses"`
	Restored  uint64    `json:"restored"`
	LastError string    `json:"last_error,omitempty"`
	ErrorAt   time.Time `json:"last_error_at,omitzero"`
}

// sessionWatch follows a session through its log; the zero value is
// connected (a mount exists only once its first connection did).
type sessionWatch struct {
	mu sync.Mutex
	s  sessionState
}

func newSessionWatch() *sessionWatch {
	return &sessionWatch{s: sessionState{Connected: true, Since: time.Now()}}
}

func (w *sessionWatch) state() sessionState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.s
}

// wrap returns a logger that logs as l does and tells w of the
// session's lines, the debug ones too, whatever l's level.
func (w *sessionWatch) wrap(l *slog.Logger) *slog.Logger {
	return slog.New(&sessionHandler{Handler: l.Handler(), w: w})
}

func (w *sessionWatch) note(r slog.Record) {
	var errText string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			errText = a.Value.String()
		}
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	switch r.Message {
	case msgLost:
		w.s.Connected, w.s.Since = false, r.Time
		w.s.Losses++
	case msgRestored:
		w.s.Connected, w.s.Since = true, r.Time
		w.s.Restored++
		return
	}
	if errText != "" {
		w.s.LastError, w.s.ErrorAt = errText, r.Time
	}
}

// sessionHandler passes records on to Handler and the session's to w.
// Debug records are asked for whatever the level: only two places log
// at debug (the redial and a lock probe), so this costs nothing.
type sessionHandler struct {
	slog.Handler
	w *sessionWatch
}

func (h *sessionHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sessionHandler) Handle(ctx context.Context, r slog.Record) error {
	switch r.Message {
	case msgLost, msgRestored, msgRedial:
		h.w.note(r)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *sessionHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &sessionHandler{Handler: h.Handler.WithAttrs(as), w: h.w}
}

func (h *sessionHandler) WithGroup(name string) slog.Handler {
	return &sessionHandler{Handler: h.Handler.WithGroup(name), w: h.w}
}
