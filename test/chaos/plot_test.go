package chaos

import (
	"image/color"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// marker is a fault or milestone drawn as a vertical line.
type marker struct {
	at    time.Duration
	label string
}

// watched is one key's curve in the third panel: its cumulative
// admissions and the most its rule allows by then (bound of seconds since
// the key's first check).
type watched struct {
	name  string
	key   int32
	bound func(sinceFirst float64) float64
}

const bin = 250 * time.Millisecond

var markerColors = []color.Color{
	color.RGBA{R: 200, A: 255}, color.RGBA{R: 230, G: 120, A: 255},
	color.RGBA{G: 140, B: 40, A: 255}, color.RGBA{B: 200, R: 120, A: 255},
}

// timeline writes timeline.png: answered checks/s, degraded %, and
// admitted-vs-limit for the watched keys, with the markers as vertical
// lines on every panel.
func timeline(t *testing.T, dir, title string, evs []event, keys []check, ws []watched, marks []marker) {
	t.Helper()
	var end time.Duration
	for _, e := range evs {
		end = max(end, e.recv)
	}
	nb := int(end/bin) + 1
	answered := make([]float64, nb)
	unanswered := make([]float64, nb)
	total := make([]float64, nb)
	degraded := make([]float64, nb)
	for _, e := range evs {
		b := int(e.sent / bin)
		total[b]++
		if e.answered() {
			answered[b]++
		} else {
			unanswered[b]++
		}
		if e.ok && e.degraded {
			degraded[b]++
		}
	}
	perSec := float64(time.Second / bin)
	rate := func(v []float64) plotter.XYs {
		xy := make(plotter.XYs, nb)
		for i := range v {
			xy[i] = plotter.XY{X: (time.Duration(i) * bin).Seconds(), Y: v[i] * perSec}
		}
		return xy
	}
	degPct := make(plotter.XYs, nb)
	for i := range degraded {
		degPct[i].X = (time.Duration(i) * bin).Seconds()
		if total[i] > 0 {
			degPct[i].Y = 100 * degraded[i] / total[i]
		}
	}

	p1 := panel(title, "checks/s")
	addLine(t, p1, rate(answered), "answered ≤ 250 ms", color.RGBA{B: 180, A: 255}, false)
	addLine(t, p1, rate(unanswered), "not answered in time", color.RGBA{R: 220, A: 255}, false)
	p2 := panel("", "degraded %")
	addLine(t, p2, degPct, "degraded", color.RGBA{R: 200, G: 130, A: 255}, false)
	p3 := panel("", "admitted (cost)")
	p3.X.Label.Text = "seconds since load start"
	palette := []color.Color{color.RGBA{B: 160, A: 255}, color.RGBA{G: 130, A: 255}, color.RGBA{R: 150, B: 150, A: 255}}
	for i, w := range ws {
		var cum float64
		var first time.Duration = -1
		var got, lim plotter.XYs
		for _, e := range evs {
			if e.key != w.key {
				continue
			}
			if first < 0 {
				first = e.sent
			}
			if e.admitted() {
				cum += float64(keys[e.key].cost)
			}
			got = append(got, plotter.XY{X: e.recv.Seconds(), Y: cum})
			lim = append(lim, plotter.XY{X: e.recv.Seconds(), Y: w.bound((e.recv - first).Seconds())})
		}
		if len(got) == 0 {
			continue
		}
		c := palette[i%len(palette)]
		addLine(t, p3, got, w.name+" admitted", c, false)
		addLine(t, p3, lim, w.name+" limit", c, true)
	}
	for _, p := range []*plot.Plot{p1, p2, p3} {
		p.X.Min, p.X.Max = 0, end.Seconds()
		for i, m := range marks {
			ymax := p.Y.Max
			if ymax <= p.Y.Min {
				ymax = p.Y.Min + 1
			}
			label := ""
			if p == p1 {
				label = m.label
			}
			addLine(t, p, plotter.XYs{{X: m.at.Seconds(), Y: p.Y.Min}, {X: m.at.Seconds(), Y: ymax}}, label,
				markerColors[i%len(markerColors)], true)
		}
		p.Legend.Top = true
	}

	img := vgimg.New(10*vg.Inch, 9*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 3, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(4), PadY: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{{p1}, {p2}, {p3}}, tiles, dc)
	p1.Draw(canvases[0][0])
	p2.Draw(canvases[1][0])
	p3.Draw(canvases[2][0])
	f, err := os.Create(filepath.Join(dir, "timeline.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		t.Fatal(err)
	}
}

func panel(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	return p
}

func addLine(t *testing.T, p *plot.Plot, xy plotter.XYs, label string, c color.Color, dashed bool) {
	t.Helper()
	if len(xy) == 0 {
		return
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		t.Fatal(err)
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if label != "" {
		p.Legend.Add(label, l)
	}
}
