package export

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shalefs/shale/p9wire"
)

// counters are what the stats file of the journal tree reports.
type counters struct {
	byType            [256]atomic.Uint64 // requests read, by 9P type
	bytesIn, bytesOut atomic.Uint64      // whole frames
}

// typeNames name the 9P2000.L requests in the stats file.
var typeNames = []struct {
	typ  uint8
	name string
}{
	{p9wire.Tversion, "Tversion"}, {p9wire.Tauth, "Tauth"}, {p9wire.Tattach, "Tattach"},
	{p9wire.Tflush, "Tflush"}, {p9wire.Twalk, "Twalk"}, {p9wire.Tread, "Tread"},
	{p9wire.Twrite, "Twrite"}, {p9wire.Tclunk, "Tclunk"}, {p9wire.Tremove, "Tremove"},
	{p9wire.Tstatfs, "Tstatfs"}, {p9wire.Tlopen, "Tlopen"}, {p9wire.Tlcreate, "Tlcreate"},
	{p9wire.Tsymlink, "Tsymlink"}, {p9wire.Tmknod, "Tmknod"}, {p9wire.Trename, "Trename"},
	{p9wire.Treadlink, "Treadlink"}, {p9wire.Tgetattr, "Tgetattr"}, {p9wire.Tsetattr, "Tsetattr"},
	{p9wire.Txattrwalk, "Txattrwalk"}, {p9wire.Txattrcreate, "Txattrcreate"}, {p9wire.Treaddir, "Treaddir"},
	{p9wire.Tfsync, "Tfsync"}, {p9wire.Tlock, "Tlock"}, {p9wire.Tgetlock, "Tgetlock"},
	{p9wire.Tlink, "Tlink"}, {p9wire.Tmkdir, "Tmkdir"}, {p9wire.Trenameat, "Trenameat"},
	{p9wire.Tunlinkat, "Tunlinkat"},
}

// Stats is the text of the journal tree's stats file, for a process's
// own use (shale serve --metrics).
func (s *Server) Stats() []byte { return s.stats() }

// ParseStats reads a stats file b (Stats): its values by name, and the
// names in the file's order.
func ParseStats(b []byte) (v map[string]uint64, order []string) {
	v = map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		n, err := strconv.ParseUint(val, 10, 64)
		if ok && err == nil {
			v[name] = n
			order = append(order, name)
		}
	}
	return v, order
}

// stats is the text of the stats file: "name value" a line, names
// without spaces, values decimal integers. docs/network.md lists them.
func (s *Server) stats() []byte {
	var b strings.Builder
	line := func(name string, v any) { fmt.Fprintf(&b, "%s %v\n", name, v) }
	var n [256]uint64
	all := uint64(0)
	for t := range n {
		n[t] = s.counts.byType[t].Load()
		all += n[t]
	}
	named := uint64(0)
	for _, t := range typeNames {
		named += n[t.typ]
		line("requests."+t.name, n[t.typ])
	}
	line("requests.other", all-named)
	line("requests", all)
	line("bytes.in", s.counts.bytesIn.Load())
	line("bytes.out", s.counts.bytesOut.Load())
	s.mu.Lock()
	line("connections", len(s.conns))
	line("connections.sessions", s.sessions)
	s.mu.Unlock()
	line("connections.pending", s.pending.Len())
	line("connections.reaped", s.reaped.Load())
	line("connections.refused", s.refused.Load())
	line("connections.fenced", s.fences.Load())
	line("squash.refused", s.squashed.refused.Load())

	ctl := s.ctl
	ctl.mu.Lock()
	ctl.sweepLocked(time.Now())
	journals, connected, interest := len(ctl.journals), 0, 0
	for _, j := range ctl.journals {
		j.mu.Lock()
		if j.conns > 0 {
			connected++
		}
		interest += len(j.interest)
		j.mu.Unlock()
	}
	ctl.mu.Unlock()
	line("journals", journals)
	line("journals.connected", connected)
	line("interest", interest)
	line("records.queued", ctl.queued.Load())
	line("records.made", ctl.made.Load())
	line("records.sent", ctl.sent.Load())
	line("resets", ctl.resets.Load())
	line("journals.late", ctl.late.Load())
	line("journals.bytes", ctl.bytes.Load())
	line("journals.bytes.abandoned", ctl.idleBytes.Load())
	line("epoch", ctl.epoch)
	sp := s.sp
	sp.mu.Lock()
	files := len(sp.files)
	sp.mu.Unlock()
	line("sprite.files", files)
	line("sprite.opens", sp.opens.Load())
	line("sprite.opens.write", sp.writeOpens.Load())
	line("sprite.opens.recall", sp.recalls.Load())
	line("sprite.opens.shared", sp.shared.Load())
	line("sprite.opens.grace", sp.graceWaits.Load())
	line("sprite.recall.timeouts", sp.timeouts.Load())
	line("sprite.writebacks", sp.writeBacks.Load())
	line("sprite.writebacks.refused", sp.refused.Load())
	line("sprite.evictions", sp.evictions.Load())
	line("sprite.delegations.granted", sp.delegated.Load())
	line("sprite.delegations.returns", sp.returns.Load())
	line("sprite.delegations.held", uint64(max(sp.outstanding.Load(), 0)))
	line("sprite.reclaims.unheld", sp.forged.Load())
	return []byte(b.String())
}
