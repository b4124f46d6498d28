package metrics

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// scrape GETs /metrics of s and returns its lines.
func scrape(t *testing.T, c *http.Client, s *Server) map[string]bool {
	t.Helper()
	resp, err := c.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: reading body: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("scrape: Content-Type %q, want text/plain", ct)
	}
	lines := make(map[string]bool)
	for line := range strings.SplitSeq(string(body), "\n") {
		lines[line] = true
	}
	return lines
}

// wantLines fails t for each of want missing from lines.
func wantLines(t *testing.T, scrape string, lines map[string]bool, want ...string) {
	t.Helper()
	for _, w := range want {
		if !lines[w] {
			t.Errorf("%s scrape: no line %q", scrape, w)
		}
	}
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestServe(t *testing.T) {
	var (
		mu      sync.Mutex
		samples []Sample
	)
	set := func(read, open float64) {
		mu.Lock()
		defer mu.Unlock()
		samples = []Sample{
			{Name: "shale_test_read_bytes_total", Help: "Bytes read.", Labels: map[string]string{"remote": "a", "op": "read"}, Value: read},
			{Name: "shale_test_read_bytes_total", Help: "Bytes read.", Labels: map[string]string{"remote": "b", "op": "read"}, Value: 2 * read},
			{Name: "shale_test_open_files", Help: "Files open.", Gauge: true, Value: open},
			// Bad: an invalid name, and labels other than the name's first.
			{Name: "shale test", Value: 1},
			{Name: "shale_test_read_bytes_total", Help: "Bytes read.", Labels: map[string]string{"other": "x"}, Value: 1},
		}
	}
	src := func() []Sample {
		mu.Lock()
		defer mu.Unlock()
		return samples
	}

	s, err := Serve("127.0.0.1:0", src)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if host, port, err := net.SplitHostPort(s.Addr()); err != nil || host != "127.0.0.1" || port == "0" {
		t.Errorf("Addr() = %q, want 127.0.0.1 and the port picked", s.Addr())
	}
	c := newClient(t)

	set(10, 3)
	lines := scrape(t, c, s)
	wantLines(t, "first", lines,
		"# HELP shale_test_read_bytes_total Bytes read.",
		"# TYPE shale_test_read_bytes_total counter",
		`shale_test_read_bytes_total{op="read",remote="a"} 10`,
		`shale_test_read_bytes_total{op="read",remote="b"} 20`,
		"# HELP shale_test_open_files Files open.",
		"# TYPE shale_test_open_files gauge",
		"shale_test_open_files 3",
		"# TYPE shale_metrics_bad_samples_total counter",
		"shale_metrics_bad_samples_total 2",
		"# TYPE go_goroutines gauge",
		"# TYPE process_cpu_seconds_total counter",
	)
	for line := range lines {
		if strings.Contains(line, "shale test") || strings.Contains(line, "other=") {
			t.Errorf("first scrape: bad sample served: %q", line)
		}
	}

	set(12.5, 1)
	lines = scrape(t, c, s)
	wantLines(t, "second", lines,
		`shale_test_read_bytes_total{op="read",remote="a"} 12.5`,
		`shale_test_read_bytes_total{op="read",remote="b"} 25`,
		"shale_test_open_files 1",
		"shale_metrics_bad_samples_total 4",
	)
	if lines["shale_test_open_files 3"] {
		t.Error("second scrape: still shows the first value of shale_test_open_files")
	}

	// The registry saw no error: the bad samples never reached it.
	if _, err := s.reg.Gather(); err != nil {
		t.Errorf("Gather: %v", err)
	}
}

func TestBadSamples(t *testing.T) {
	good := Sample{Name: "shale_x_total", Help: "X.", Labels: map[string]string{"a": "1"}, Value: 1}
	with := func(f func(*Sample)) Sample {
		s := good
		s.Labels = map[string]string{"a": "2"}
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		bad  Sample
	}{
		{"empty name", Sample{}},
		{"invalid name", Sample{Name: "shale-x"}},
		{"name beginning with a digit", Sample{Name: "1shale"}},
		{"utf-8 name", Sample{Name: "shale_ü"}},
		{"runtime's name", Sample{Name: "go_goroutines", Gauge: true}},
		{"process's name", Sample{Name: "process_open_fds", Gauge: true}},
		{"own name", Sample{Name: badSamplesName}},
		{"invalid label name", Sample{Name: "shale_y", Labels: map[string]string{"a:b": "1"}}},
		{"reserved label name", Sample{Name: "shale_y", Labels: map[string]string{"__a": "1"}}},
		{"label value not utf-8", Sample{Name: "shale_y", Labels: map[string]string{"a": "\xff"}}},
		{"other label names", with(func(s *Sample) { s.Labels = map[string]string{"b": "1"} })},
		{"more label names", with(func(s *Sample) { s.Labels["b"] = "1" })},
		{"no labels", with(func(s *Sample) { s.Labels = nil })},
		{"other help", with(func(s *Sample) { s.Help = "Y." })},
		{"other type", with(func(s *Sample) { s.Gauge = true })},
		{"same label values", with(func(s *Sample) { s.Labels["a"] = "1" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &sourceCollector{src: func() []Sample { return []Sample{good, tc.bad} }}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatalf("Gather: %v", err)
			}
			got := make(map[string]float64)
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					got[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
			want := map[string]float64{"shale_x_total": 1, badSamplesName: 1}
			if len(got) != len(want) || got["shale_x_total"] != 1 || got[badSamplesName] != 1 {
				t.Errorf("gathered %v, want %v", got, want)
			}
		})
	}
}

func TestNilSource(t *testing.T) {
	s, err := Serve("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantLines(t, "nil source", scrape(t, newClient(t), s), "shale_metrics_bad_samples_total 0")
}

func TestServeErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()

	for _, tc := range []struct{ addr, want string }{
		{addr, "metrics address " + addr + ": address already in use: pick another port"},
		{"", "metrics address is empty: use host:port, e.g. 127.0.0.1:9101"},
		{"9101", "metrics address 9101: missing port in address: use host:port, e.g. 127.0.0.1:9101"},
		{"127.0.0.1:", "metrics address 127.0.0.1:: missing port: use host:port, e.g. 127.0.0.1:9101"},
		{"127.0.0.1:http", `metrics address 127.0.0.1:http: port "http" is not a number from 0 to 65535: use host:port, e.g. 127.0.0.1:9101`},
		{"127.0.0.1:65536", `metrics address 127.0.0.1:65536: port "65536" is not a number from 0 to 65535: use host:port, e.g. 127.0.0.1:9101`},
	} {
		s, err := Serve(tc.addr, nil)
		if err == nil {
			s.Close()
			t.Errorf("Serve(%q) succeeded, want %q", tc.addr, tc.want)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("Serve(%q) = %q, want %q", tc.addr, err, tc.want)
		}
	}
}

func TestClose(t *testing.T) {
	s, err := Serve("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	c := newClient(t)
	scrape(t, c, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if resp, err := c.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Errorf("scrape after Close: %s, want an error", resp.Status)
	}
	// The port is free again.
	s2, err := Serve(addr, nil)
	if err != nil {
		t.Fatalf("Serve again on %s after Close: %v", addr, err)
	}
	if err := s2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
