// Command plot draws bench/net/cache.sh's raw results (lines of
// "rep<TAB>row<TAB>step<TAB>seconds|timeout|failed<TAB>requests|-" on
// stdin) as a PNG: median time against added round-trip time, one line per
// system (uncached, cached, disk; local, which has no network, as a dashed
// level), in four panels: the cold build, the hot build, the build after
// the client restarted, and the metadata steps summed. The time axis is
// logarithmic. A median that timed out is drawn at the timeout, hollow.
//
//	go run ./bench/net/plot -rows local,uncached-0ms,… -timeout 150 -o docs/network-latency.png <results.tsv
//
// Only the standard library: labels are drawn with a 5x7 font of its own.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type key struct{ row, step string }

var (
	data  = map[key][]float64{} // seconds; +Inf: timed out; NaN: failed
	limit float64
)

func main() {
	rowsFlag := flag.String("rows", "", "the rows, comma-separated, as bench/net/cache.sh ran them")
	out := flag.String("o", "network-latency.png", "the PNG to write")
	to := flag.Int("timeout", 0, "the step timeout in seconds")
	flag.Parse()
	limit = float64(*to)

	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			continue
		}
		v := math.NaN()
		switch f[3] {
		case "timeout":
			v = math.Inf(1)
		case "failed":
		default:
			x, err := strconv.ParseFloat(f[3], 64)
			if err != nil {
				fail("bad time %q", f[3])
			}
			v = x
		}
		data[key{f[1], f[2]}] = append(data[key{f[1], f[2]}], v)
	}

	var rtts []float64
	seen := map[float64]bool{}
	for _, r := range strings.Split(*rowsFlag, ",") {
		_, rtt, ok := strings.Cut(r, "-")
		if !ok {
			continue
		}
		ms, err := strconv.Atoi(strings.TrimSuffix(rtt, "ms"))
		if err != nil {
			fail("bad row %q", r)
		}
		if !seen[float64(ms)] {
			seen[float64(ms)] = true
			rtts = append(rtts, float64(ms))
		}
	}
	sort.Float64s(rtts)
	if len(rtts) == 0 {
		fail("no remote rows in -rows %q", *rowsFlag)
	}

	meta := []string{"cp -a", "find (cold)", "find (warm)", "grep -r (cold)", "grep -r (warm)", "rm -r"}
	panels := []struct {
		title string
		steps []string
	}{
		{"build, cold (compile and link)", []string{"build (cold)"}},
		{"build, hot (nothing to do)", []string{"build (hot)"}},
		{"build after a client restart", []string{"build (restart)"}},
		{"metadata: cp -a, find, grep -r, rm -r", meta},
	}

	const pw, ph = 520, 340 // one panel
	const top, bottom = 44, 44
	img := image.NewRGBA(image.Rect(0, 0, 2*pw, top+2*ph+bottom))
	fill(img, img.Bounds(), color.White)
	text(img, 16, 14, "shale 9p: time against added round-trip time (median of the runs; log scale)", black, 2)
	for i, p := range panels {
		x0, y0 := (i%2)*pw, top+(i/2)*ph
		drawPanel(img, image.Rect(x0, y0, x0+pw, y0+ph), p.title, p.steps, rtts)
	}
	// The legend.
	x, y := 16, top+2*ph+14
	for _, s := range systems {
		fill(img, image.Rect(x, y+3, x+24, y+9), s.col)
		text(img, x+30, y, s.name, black, 2)
		x += 30 + 12*len(s.name) + 28
	}
	text(img, x, y, "(hollow: stopped at the timeout)", grey, 2)

	f, err := os.Create(*out)
	if err != nil {
		fail("%v", err)
	}
	if err := png.Encode(f, img); err != nil {
		fail("%v", err)
	}
	if err := f.Close(); err != nil {
		fail("%v", err)
	}
}

var (
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{120, 120, 120, 255}
	light = color.RGBA{225, 225, 225, 255}
)

var systems = []struct {
	name string
	col  color.RGBA
}{
	{"local", color.RGBA{90, 90, 90, 255}},
	{"uncached", color.RGBA{200, 40, 40, 255}},
	{"cached", color.RGBA{30, 90, 200, 255}},
	{"disk", color.RGBA{20, 150, 60, 255}},
}

// value: the median of row's runs of steps, summed; NaN if any is
// missing or failed, +Inf if any median timed out.
func value(row string, steps []string) float64 {
	t := 0.0
	for _, s := range steps {
		vs := append([]float64(nil), data[key{row, s}]...)
		if len(vs) == 0 {
			return math.NaN()
		}
		for i, v := range vs {
			if math.IsNaN(v) {
				vs[i] = math.MaxFloat64 // failed: the slowest
			}
		}
		sort.Float64s(vs)
		m := vs[(len(vs)-1)/2]
		if len(vs)%2 == 0 && !math.IsInf(vs[len(vs)/2], 0) && vs[len(vs)/2] != math.MaxFloat64 {
			m = (m + vs[len(vs)/2]) / 2
		}
		if m == math.MaxFloat64 {
			return math.NaN()
		}
		t += m
	}
	return t
}

func drawPanel(img *image.RGBA, r image.Rectangle, title string, steps []string, rtts []float64) {
	// The plotting area.
	a := image.Rect(r.Min.X+78, r.Min.Y+30, r.Max.X-22, r.Max.Y-58)
	text(img, r.Min.X+78, r.Min.Y+6, title, black, 2)

	type pt struct {
		x, y    float64
		stopped bool
	}
	lines := map[string][]pt{}
	lo, hi := math.Inf(1), math.Inf(-1)
	note := func(v float64) {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	localV := value("local", steps)
	if !math.IsNaN(localV) && localV > 0 && !math.IsInf(localV, 0) {
		note(localV)
	}
	for _, s := range systems[1:] {
		for _, rtt := range rtts {
			v := value(fmt.Sprintf("%s-%.0fms", s.name, rtt), steps)
			if math.IsNaN(v) {
				continue
			}
			p := pt{x: rtt, y: v}
			if math.IsInf(v, 0) {
				p.y, p.stopped = limit*float64(len(steps)), true
			}
			if p.y <= 0 {
				continue
			}
			note(p.y)
			lines[s.name] = append(lines[s.name], p)
		}
	}
	if math.IsInf(lo, 0) {
		text(img, a.Min.X+20, a.Min.Y+40, "no data", grey, 2)
		return
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	xmax := rtts[len(rtts)-1]
	if xmax == 0 {
		xmax = 1
	}
	px := func(x float64) int { return a.Min.X + int(math.Round(x/xmax*float64(a.Dx()))) }
	py := func(y float64) int {
		return a.Max.Y - int(math.Round((math.Log10(y)-dlo)/(dhi-dlo)*float64(a.Dy())))
	}

	// Grid and axes: decades (and 2 and 5 between them, unlabelled).
	for d := dlo; d <= dhi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > dhi+1e-9 {
				break
			}
			y := py(v)
			hline(img, a.Min.X, a.Max.X, y, light)
			if m == 1 {
				l := strconv.FormatFloat(v, 'f', -1, 64)
				text(img, a.Min.X-8-12*len(l), y-7, l, black, 2)
			}
		}
	}
	for _, rtt := range rtts {
		x := px(rtt)
		vline(img, x, a.Min.Y, a.Max.Y, light)
		l := strconv.FormatFloat(rtt, 'f', -1, 64)
		text(img, x-6*len(l), a.Max.Y+8, l, black, 2)
	}
	hline(img, a.Min.X, a.Max.X, a.Max.Y, black)
	vline(img, a.Min.X, a.Min.Y, a.Max.Y, black)
	text(img, a.Min.X+a.Dx()/2-12*8, a.Max.Y+30, "added rtt, ms", black, 2)
	text(img, r.Min.X+4, a.Min.Y-20, "s", black, 2)

	if !math.IsNaN(localV) && localV > 0 && !math.IsInf(localV, 0) {
		y := py(localV)
		for x := a.Min.X; x < a.Max.X; x += 12 {
			for t := 0; t < 7 && x+t < a.Max.X; t++ {
				dot(img, x+t, y, systems[0].col)
			}
		}
	}
	for _, s := range systems[1:] {
		ps := lines[s.name]
		for i, p := range ps {
			x, y := px(p.x), py(p.y)
			if i > 0 {
				line(img, px(ps[i-1].x), py(ps[i-1].y), x, y, s.col)
			}
			box := image.Rect(x-4, y-4, x+5, y+5)
			if p.stopped {
				fill(img, box, s.col)
				fill(img, box.Inset(2), color.White)
			} else {
				fill(img, box, s.col)
			}
		}
	}
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.Set(x, y, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	fill(img, image.Rect(x0, y, x1+1, y+1), c)
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	fill(img, image.Rect(x, y0, x+1, y1+1), c)
}

// dot: a 2x2 pixel, for lines two pixels wide.
func dot(img *image.RGBA, x, y int, c color.Color) {
	fill(img, image.Rect(x, y, x+2, y+2), c)
}

// line: Bresenham's, two pixels wide.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		dot(img, x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		if 2*e >= dy {
			e += dy
			x0 += sx
		}
		if 2*e <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// text draws s at (x, y), its top left, each pixel of the 5x7 font scale
// pixels square; a character advances 6*scale. Capitals are drawn as
// small letters; a character the font lacks, as a blank.
func text(img *image.RGBA, x, y int, s string, c color.Color, scale int) {
	for _, ch := range strings.ToLower(s) {
		if g, ok := font[ch]; ok {
			for row, bits := range g {
				for col, b := range bits {
					if b == '#' {
						fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
					}
				}
			}
		}
		x += 6 * scale
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "plot: "+format+"\n", args...)
	os.Exit(1)
}
