package volume

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// putCounter stands between the volume and the real S3 server and
// counts the PUTs in flight at once. Each PUT is held until another is
// in flight too, or holdFor passes: uploads one at a time cannot reach
// two, however fast the machine.
type putCounter struct {
	mu             sync.Mutex
	cond           *sync.Cond
	inFlight, most int
	holdFor        time.Duration
	next           http.Handler
}

func (p *putCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		p.next.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	p.inFlight++
	p.most = max(p.most, p.inFlight)
	p.cond.Broadcast()
	deadline := time.Now().Add(p.holdFor)
	for p.most < 2 && time.Now().Before(deadline) {
		go func() { time.Sleep(50 * time.Millisecond); p.cond.Broadcast() }()
		p.cond.Wait()
	}
	p.mu.Unlock()
	p.next.ServeHTTP(w, r)
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
}

// TestParallelUploads: a write-back of several blocks puts them to S3
// (the real server, through a counting proxy) several at once, and no
// more than uploads at once; the file reads back whole on another client.
func TestParallelUploads(t *testing.T) {
	_, s3 := engines(t)
	u, err := url.Parse(s3)
	if err != nil {
		t.Fatal(err)
	}
	target := &url.URL{Scheme: u.Scheme, Host: u.Host}
	pc := &putCounter{holdFor: 2 * time.Second, next: httputil.NewSingleHostReverseProxy(target)}
	pc.cond = sync.NewCond(&pc.mu)
	// The request keeps the Host it was signed for (the proxy's).
	srv := httptest.NewServer(pc)
	defer srv.Close()
	lower := testVolumeOn(t, bs, strings.Replace(s3, u.Host, strings.TrimPrefix(srv.URL, "http://"), 1))

	_, root := mount(t, lower)
	data := pattern(7, 2*uploads*bs)
	writeFile(t, root, "f", data)
	pc.mu.Lock()
	most := pc.most
	pc.mu.Unlock()
	if most < 2 {
		t.Errorf("at most %d PUT in flight during a write-back of %d blocks: uploads are one at a time", most, 2*uploads)
	}
	if most > uploads {
		t.Errorf("%d PUTs in flight at once, want at most %d", most, uploads)
	}
	_, root2 := mount(t, lower)
	if got := readFile(t, lookup(t, root2, "f")); !bytes.Equal(got, data) {
		t.Fatal("the file read back on another client differs")
	}
}
