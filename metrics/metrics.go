// Package metrics serves a process's counters to Prometheus: the endpoint
// behind `shale serve --metrics` and `shale mount --metrics`.
//
// The caller describes its counters as a Source, a function read afresh at
// every scrape; Serve puts its samples, with the Go runtime's and the
// process's own metrics (go_*, process_*), on /metrics in the Prometheus
// text format. Nothing is kept between scrapes but the count of bad
// samples: the values are the Source's.
//
// A sample the Prometheus data model cannot hold — an invalid or reserved
// name, an invalid label name, labels, help or type differing from those of
// the first sample of its name, a repeated set of label values — is left
// out and counted in shale_metrics_bad_samples_total, so that one bad
// sample never costs the scrape.
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sample is one value of a Source at a scrape.
type Sample struct {
	Name   string // full metric name, e.g. "shale_client_read_bytes_total"
	Help   string
	Gauge  bool              // false: a counter
	Labels map[string]string // may be nil; samples of one Name must all use the same label names
	Value  float64
}

// Source is read at every scrape; it must be cheap and safe to call from any
// goroutine.
//
// Names and label names must be classic Prometheus ones
// ([a-zA-Z_:][a-zA-Z0-9_:]* and [a-zA-Z_][a-zA-Z0-9_]*, not beginning with
// "__"); names beginning with "go_" or "process_" are the runtime's and the
// process's, and shale_metrics_bad_samples_total is this package's. The
// samples of one Name must agree on Help, Gauge and the label names, and
// differ in the label values. A nil Source has no samples.
type Source func() []Sample

// badSamplesName is the counter of the samples left out.
const badSamplesName = "shale_metrics_bad_samples_total"

// Server is a running metrics endpoint, made by Serve.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	reg  *prometheus.Registry
	done chan struct{} // closed when srv.Serve has returned
	err  error         // what srv.Serve returned, once done is closed

	closeOnce sync.Once
	closeErr  error
}

// Serve listens on addr (host:port, e.g. 127.0.0.1:9101) and serves /metrics
// (the Prometheus text format, via promhttp) with src's samples plus the Go
// runtime and process collectors. It returns once listening, with the server
// running in the background; errors are one clear line naming the address
// and what to do (e.g. "metrics address 127.0.0.1:9101: address already in
// use: pick another port"). Close stops it.
//
// An empty host listens on every address of the machine, port 0 on a port
// the system picks (see Server.Addr).
func Serve(addr string, src Source) (*Server, error) {
	if err := checkAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, listenError(addr, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&sourceCollector{src: src},
	)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A collector's error loses its metric, not the scrape.
		ErrorHandling: promhttp.ContinueOnError,
	}))

	s := &Server{
		ln:   ln,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		reg:  reg,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		s.err = s.srv.Serve(ln)
	}()
	return s, nil
}

// Addr returns the address actually listened on, host:port: with port 0,
// the port the system picked.
func (s *Server) Addr() string {
	return s.ln.Addr().String()
}

// Close stops the server: it stops listening, closes the connections,
// scrapes in progress included, and returns once the server has stopped.
// Later calls return what the first returned.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.srv.Close()
		<-s.done
		if s.closeErr == nil && !errors.Is(s.err, http.ErrServerClosed) {
			s.closeErr = s.err
		}
	})
	return s.closeErr
}

// checkAddr checks that addr is host:port with a numeric port, and says how
// to write it if not.
func checkAddr(addr string) error {
	const how = "use host:port, e.g. 127.0.0.1:9101"
	if addr == "" {
		return errors.New("metrics address is empty: " + how)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return fmt.Errorf("metrics address %s: %v: %s", addr, err, how)
	}
	if port == "" {
		return fmt.Errorf("metrics address %s: missing port: %s", addr, how)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("metrics address %s: port %q is not a number from 0 to 65535: %s", addr, port, how)
	}
	return nil
}

// listenError turns net.Listen's error into one line saying what to do.
func listenError(addr string, err error) error {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("metrics address %s: %v: pick another port", addr, syscall.EADDRINUSE)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("metrics address %s: %v: pick a port above 1023", addr, syscall.EACCES)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("metrics address %s: %v: the host is no address of this machine; use one that is, or leave it empty for all", addr, syscall.EADDRNOTAVAIL)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("metrics address %s: host %s not found: use an IP address or a name that resolves", addr, dnsErr.Name)
	}
	// The innermost error, without net's "listen tcp addr:" prefix.
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		err = opErr.Err
	}
	var sysErr *os.SyscallError
	if errors.As(err, &sysErr) {
		err = sysErr.Err
	}
	return fmt.Errorf("metrics address %s: %v: check the address", addr, err)
}

// sourceCollector is an unchecked prometheus.Collector (Describe sends
// nothing) whose metrics are a Source's samples, made const metrics at each
// Collect.
type sourceCollector struct {
	src Source
	bad atomic.Uint64 // samples left out, over all scrapes
}

var badSamplesDesc = prometheus.NewDesc(badSamplesName,
	"Samples of the process's counters left out of scrapes: an invalid name or labels, or inconsistent with others of their name.",
	nil, nil)

// Describe sends nothing: the Source's metrics are not known in advance.
func (c *sourceCollector) Describe(chan<- *prometheus.Desc) {}

// family is what the first good sample of a name fixed for the others.
type family struct {
	help   string
	gauge  bool
	labels []string        // sorted label names
	seen   map[string]bool // label values already collected, joined by "\xff"
}

// Collect sends the Source's good samples as const metrics, then the count
// of bad ones.
func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	var samples []Sample
	if c.src != nil {
		samples = c.src()
	}
	families := make(map[string]*family)
	for _, s := range samples {
		if m := collectSample(families, s); m != nil {
			ch <- m
		} else {
			c.bad.Add(1)
		}
	}
	ch <- prometheus.MustNewConstMetric(badSamplesDesc, prometheus.CounterValue, float64(c.bad.Load()))
}

// collectSample returns s as a const metric, or nil if s is bad. families
// holds the names collected so far in this scrape.
func collectSample(families map[string]*family, s Sample) prometheus.Metric {
	if !validName(s.Name, true) || reservedName(s.Name) {
		return nil
	}
	names := make([]string, 0, len(s.Labels))
	for name := range s.Labels {
		if !validName(name, false) || strings.HasPrefix(name, "__") {
			return nil
		}
		names = append(names, name)
	}
	slices.Sort(names)
	values := make([]string, len(names))
	for i, name := range names {
		values[i] = s.Labels[name]
	}

	f := families[s.Name]
	if f != nil && (f.help != s.Help || f.gauge != s.Gauge || !slices.Equal(f.labels, names)) {
		return nil
	}
	key := strings.Join(values, "\xff")
	if f != nil && f.seen[key] {
		return nil
	}
	typ := prometheus.CounterValue
	if s.Gauge {
		typ = prometheus.GaugeValue
	}
	m, err := prometheus.NewConstMetric(prometheus.NewDesc(s.Name, s.Help, names, nil), typ, s.Value, values...)
	if err != nil { // e.g. a label value that is not UTF-8
		return nil
	}
	if f == nil {
		f = &family{help: s.Help, gauge: s.Gauge, labels: names, seen: make(map[string]bool)}
		families[s.Name] = f
	}
	f.seen[key] = true
	return m
}

// validName reports whether name is a classic Prometheus metric name
// ([a-zA-Z_:][a-zA-Z0-9_:]*) or, if !metric, label name ([a-zA-Z_][a-zA-Z0-9_]*).
func validName(name string, metric bool) bool {
	if name == "" {
		return false
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '_':
		case r >= '0' && r <= '9' && i > 0:
		case r == ':' && metric:
		default:
			return false
		}
	}
	return true
}

// reservedName reports whether name belongs to another collector of the
// endpoint.
func reservedName(name string) bool {
	return name == badSamplesName || strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_")
}
