package main

// shale status: the shale mounts of the machine (mountinfo) and its
// servers, as each serving process tells of itself on a unix socket in
// statsDir: stats-HASH.sock for a mountpoint, serve-HASH.sock for a
// server's listening address.

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/coherence"
	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
	"github.com/shalefs/shale/stack"
)

// started is when this process began, for the uptime status shows.
var started = time.Now()

// viewStatus is what a serving process tells of one of its mountpoints.
type viewStatus struct {
	Pid        int       `json:"pid"`
	Started    time.Time `json:"started"`
	Lower      string    `json:"lower"`
	Layers     []string  `json:"layers"` // the view's stack, bottom-most first; none for the loop view
	Mountpoint string    `json:"mountpoint"`
}

// mountReply is the answer on a mountpoint's socket: the view, its FUSE
// requests and the stack's coherence callbacks, and, with a 9p:// lower,
// its client's counters, inline, as shale stats --json has always given
// them.
type mountReply struct {
	*remote.Stats
	Mount     viewStatus       `json:"mount"`
	Fuse      *fuseview.Stats  `json:"fuse,omitempty"`
	Coherence *coherence.Stats `json:"coherence,omitempty"`
	Session   *sessionState    `json:"session,omitempty"` // a 9p:// lower's connection
}

// serverStatus is what shale serve tells of itself.
type serverStatus struct {
	Pid     int       `json:"pid"`
	Started time.Time `json:"started"`
	Lower   string    `json:"lower"`
	Layers  []string  `json:"layers"`
	Listen  string    `json:"listen"`
	Exports []string  `json:"exports"`
	Anames  []string  `json:"anames"` // the exports' attach names, as clients give them
	Stats   string    `json:"stats"`  // the journal controller's stats file
}

// serverSocket is where the server listening on addr answers.
func serverSocket(addr string) string {
	return filepath.Join(statsDir(), "serve-"+mountHash(addr)+".sock")
}

// serveViews answers shale status and stats for each view of p, until
// the returned stop.
func serveViews(p *plan, logger *slog.Logger) (stop func()) {
	var ls []net.Listener
	for _, v := range p.spec.Views {
		names := layerNames(p.spec)[:v.Layer]
		vs := viewStatus{Pid: os.Getpid(), Started: started, Lower: showLower(p.spec.Lower), Layers: names, Mountpoint: v.Mountpoint}
		ctr := p.counters[v.Mountpoint]
		l := answer(statsSocket(v.Mountpoint), logger, func() any {
			r := mountReply{Mount: vs}
			if ctr != nil {
				f, c := ctr.Stats(), p.manager.Stats()
				r.Fuse, r.Coherence = &f, &c
			}
			if s, ok := remote.StatsOf(p.bottom); ok {
				r.Stats = &s
			}
			if p.session != nil {
				s := p.session.state()
				r.Session = &s
			}
			return r
		})
		if l != nil {
			ls = append(ls, l)
		}
	}
	return func() {
		for _, l := range ls {
			l.Close() // removes the socket file
		}
	}
}

// answer listens on sock and answers each connection with reply's JSON.
// A socket another process answers on is left alone.
func answer(sock string, logger *slog.Logger, reply func() any) net.Listener {
	os.MkdirAll(filepath.Dir(sock), 0o755)
	if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		c.Close()
		logger.Warn("another process answers shale status here", "socket", sock)
		return nil
	}
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		logger.Warn("no status socket: shale status and stats will not show this process", "socket", sock, "err", err)
		return nil
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			json.NewEncoder(c).Encode(reply())
			c.Close()
		}
	}()
	return l
}

// ask reads the JSON answer on sock into v.
func ask(sock string, v any) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	return err
}

// readStatus asks the process serving mnt about it.
func readStatus(mnt string) (mountReply, error) {
	var r mountReply
	if err := ask(statsSocket(mnt), &r); err != nil {
		return r, fmt.Errorf("no status of %s (%v): is it a shale mount, mounted by this user? (shale status lists them)", mnt, err)
	}
	return r, nil
}

// showLower is a LOWER as status shows it: a 9p:// URL without the
// settings the command line added (cachesize, writedelay ...).
func showLower(lower string) string {
	r, ok, err := p9net.ParseRemote(lower)
	if !ok || err != nil {
		return lower
	}
	r.Query = url.Values{"aname": r.Query["aname"]}
	if len(r.Query["aname"]) == 0 {
		r.Query = nil
	}
	return r.String()
}

// stackName is a stack's layers as status shows them.
func stackName(layers []string) string {
	if len(layers) == 0 {
		return "loop"
	}
	return strings.Join(layers, "+")
}

func uptime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String()
}

func printView(w io.Writer, v viewStatus) {
	fmt.Fprintf(w, "mountpoint %s\nlower      %s\nstack      %s\npid        %d, up %s\n", v.Mountpoint, v.Lower, stackName(v.Layers), v.Pid, uptime(v.Started))
}

// statusLine is a row of shale status: a mount or a server.
type statusLine struct {
	Kind   string          `json:"kind"` // mount or server
	Where  string          `json:"where"`
	Mount  *mountReply     `json:"mount,omitempty"`
	Server *serverStatus   `json:"server,omitempty"`
	Source string          `json:"source,omitempty"` // mountinfo's, for a mount that does not answer
	Error  string          `json:"error,omitempty"`
	Reach  *reachabilityOK `json:"server_reachable,omitempty"`
}

// reachabilityOK says whether a 9p:// lower's server answers a dial.
type reachabilityOK struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func init() {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "list the shale mounts and servers of this machine",
		Long: `Status lists every shale mount (of type fuse.shale in /proc/self/mountinfo)
and every shale serve of this user (all of them, as root), one a line, with
its stack of layers, LOWER, the serving process and how long it has run. For
a mount of a 9p:// tree it adds, as the mount process tells it, whether its
connection to the server is up (since when it is down, and why; how often
it was restored) and the bytes of delayed writes not yet written back
(dirty); for a server, its exports and connected clients.

  MOUNTPOINT    STACK   LOWER                 PID    UP      STATE
  /mnt/vault    crypt   9p://10.0.0.2:5640/   4242   3h2m5s  connected, 0 B dirty

A mount whose process does not answer (another user's, or a dead mount) is
listed with what mountinfo says. --json prints one JSON object a line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			lines := statusLines()
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				for _, l := range lines {
					enc.Encode(l)
				}
				return nil
			}
			printStatus(os.Stdout, lines)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object a line")
	rootCmd.AddCommand(cmd)
}

// statusLines asks every mount and server.
func statusLines() []statusLine {
	var lines []statusLine
	// Servers first: the dial that tells whether a mount's server is up
	// is a connection the server would count.
	socks, _ := filepath.Glob(filepath.Join(statsDir(), "serve-*.sock"))
	for _, sock := range socks {
		var s serverStatus
		if ask(sock, &s) != nil {
			continue // a server killed before removing its socket
		}
		lines = append(lines, statusLine{Kind: "server", Where: s.Listen, Server: &s})
	}
	for _, m := range shaleMounts() {
		l := statusLine{Kind: "mount", Where: m.dir, Source: m.source}
		r, err := readStatus(m.dir)
		if err != nil {
			l.Error = "does not answer"
		} else {
			if r.Mount.Pid == 0 {
				// A process of an older shale: counters only.
				r.Mount.Lower = showLower(m.source)
			}
			l.Mount = &r
			if rem, ok, _ := p9net.ParseRemote(r.Mount.Lower); ok && r.Session == nil {
				// An older shale, which does not tell its session.
				l.Reach = reach(rem.Addr)
			}
		}
		lines = append(lines, l)
	}
	return lines
}

// layerNames are the names of sp's layers, bottom-most first.
func layerNames(sp *stack.Spec) []string {
	var names []string
	for _, l := range sp.Layers {
		names = append(names, l.Name)
	}
	return names
}

// reach dials a server's address, briefly.
func reach(a p9net.Addr) *reachabilityOK {
	c, err := net.DialTimeout(a.Network, a.Address, 2*time.Second)
	if err != nil {
		return &reachabilityOK{Error: err.Error()}
	}
	c.Close()
	return &reachabilityOK{OK: true}
}

func printStatus(w io.Writer, lines []statusLine) {
	if len(lines) == 0 {
		fmt.Fprintln(w, "no shale mounts or servers")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "MOUNTPOINT\tSTACK\tLOWER\tPID\tUP\tSTATE")
	for _, l := range lines {
		switch {
		case l.Kind == "server":
			s := l.Server
			fmt.Fprintf(tw, "serve %s\t%s\t%s\t%d\t%s\t%s\n", s.Listen, stackName(s.Layers), s.Lower, s.Pid, uptime(s.Started), serverState(s))
		case l.Mount == nil:
			fmt.Fprintf(tw, "%s\t-\t%s\t-\t-\t%s\n", l.Where, l.Source, l.Error)
		default:
			v := l.Mount.Mount
			pid := "-"
			if v.Pid != 0 {
				pid = fmt.Sprint(v.Pid)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Where, stackName(v.Layers), v.Lower, pid, uptime(v.Started), mountState(l))
		}
	}
	tw.Flush()
}

// mountState is a mount's STATE: for a 9p:// lower, its connection to
// the server and the delayed writes.
func mountState(l statusLine) string {
	var s []string
	if ss := l.Mount.Session; ss != nil {
		s = append(s, sessionLine(ss))
	}
	if l.Reach != nil {
		if l.Reach.OK {
			s = append(s, "server up")
		} else {
			s = append(s, "server down ("+l.Reach.Error+")")
		}
	}
	if st := l.Mount.Stats; st != nil {
		if !st.Caching {
			s = append(s, "not cached")
		}
		if sp := st.Sprite; sp != nil {
			s = append(s, fmt.Sprintf("%s dirty in %d files", humanize.IBytes(uint64(max(sp.DirtyBytes, 0))), sp.DirtyFiles))
		}
	}
	if len(s) == 0 {
		return "serving"
	}
	return strings.Join(s, ", ")
}

// serverState is a server's STATE: its exports and clients.
func serverState(s *serverStatus) string {
	conns := "?"
	for _, line := range strings.Split(s.Stats, "\n") {
		if n, ok := strings.CutPrefix(line, "connections "); ok {
			conns = n
		}
	}
	return fmt.Sprintf("exports %s, %s clients", strings.Join(s.Exports, " "), conns)
}

// sessionLine is a 9P session's state as STATE shows it.
func sessionLine(ss *sessionState) string {
	line := "connected"
	if !ss.Connected {
		line = "disconnected " + since(ss.Since)
		if ss.LastError != "" {
			line += " (" + ss.LastError + ")"
		}
	}
	if ss.Restored > 0 {
		line += fmt.Sprintf(", %d reconnections", ss.Restored)
		if ss.Connected && ss.LastError != "" {
			line += fmt.Sprintf(" (last error %s: %s)", since(ss.ErrorAt), ss.LastError)
		}
	}
	return line
}

// since is how long ago t was, in whole seconds.
func since(t time.Time) string {
	return time.Since(t).Round(time.Second).String() + " ago"
}
