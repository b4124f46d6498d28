package main

// A 9P server that squashes root (shale serve, unless --no-root-squash)
// refuses root's writes with EACCES where nobody may not write, and 9P
// carries no reason. The mount's log says why, at the first such refusal:
// the server's stats file counts the requests of squashed roots it refused
// (squash.refused), which the server logs too, naming the client.

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
)

// rootDenials explains root's refused requests on a mount of a 9P server.
type rootDenials struct {
	log   *slog.Logger
	lower string // the 9p:// URL

	mu        sync.Mutex
	explained bool      // said once: no more
	asked     time.Time // the last look at the server's stats
	asking    bool
}

// recheck is how long a refusal that was not the squash's (the server
// counts none) keeps root's next ones from asking the server again.
const recheck = time.Minute

// denied is fuseview.Options.Denied: for root, it asks the server, in
// the background, whether it refused a squashed root.
func (d *rootDenials) denied(op string, uid uint32) {
	if uid != 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.explained || d.asking || time.Since(d.asked) < recheck {
		return
	}
	d.asking = true
	go d.explain(op)
}

func (d *rootDenials) explain(op string) {
	said := false
	defer func() {
		d.mu.Lock()
		d.asking, d.asked, d.explained = false, time.Now(), said
		d.mu.Unlock()
	}()
	r, _, err := p9net.ParseRemote(d.lower)
	if err != nil {
		return
	}
	opts, err := remote.OptionsFromQuery(r.Query)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := remote.ServerStats(ctx, r, opts)
	server := showLower(d.lower)
	if err != nil {
		// Not shale serve, or not now: say what may be.
		d.log.Warn("the 9p server refused a request of root; if it squashes root (shale serve does, unless --no-root-squash), root acts as nobody there and may not write where nobody may not",
			"server", server, "request", op)
		said = true
		return
	}
	if v, _ := export.ParseStats(b); v["squash.refused"] > 0 {
		d.log.Warn("the 9p server refused a request of root: it squashes root, which acts as nobody (65534) there; start shale serve with --no-root-squash to let root act as root, or give nobody the rights it needs",
			"server", server, "request", op)
		said = true
	}
}
