package main

import (
	"fmt"
	"image/color"
	"math"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// row is one measured load: a system, a path into it, a concurrency and
// a batch (checks per call; Redis: pipeline depth).
type row struct {
	System      string  `json:"system"`
	Instances   int     `json:"instances"`
	Path        string  `json:"path"`
	Group       string  `json:"group"` // single | batched | forwarded
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch"`
	Rate        float64 `json:"rate_per_s,omitempty"` // paced calls per second; 0 = as fast as answered

	ChecksPerSec float64 `json:"checks_per_s"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// P99SchedMs is a paced row's p99 from each call's scheduled send
	// (loadgen's ResponseTime: the wait behind a late call included).
	P99SchedMs        float64 `json:"p99_from_schedule_ms,omitempty"`
	P99WakeLateMs     float64 `json:"p99_wake_late_ms,omitempty"` // paced rows: the load generator's timer lateness
	HTTPFallbacks     int64   `json:"http_fallbacks,omitempty"`   // Go client rows: calls sent over HTTP (no view) during the row
	ServerCPUSeconds  float64 `json:"server_cpu_s"`
	CPUusPerCheck     float64 `json:"server_cpu_us_per_check"`
	LoadCPUusPerCheck float64 `json:"loadgen_cpu_us_per_check"` // the load generator's own CPU (this process)
	// Context switches and read/write syscalls per check, of the servers
	// and of the load generator (proc.Sched): on this machine each costs
	// microseconds, which a profile of user code does not show.
	ServerSwitchesPerCheck float64          `json:"server_switches_per_check"`
	ServerSyscallsPerCheck float64          `json:"server_rw_syscalls_per_check"`
	LoadSwitchesPerCheck   float64          `json:"loadgen_switches_per_check"`
	LoadSyscallsPerCheck   float64          `json:"loadgen_rw_syscalls_per_check"`
	Checks                 int64            `json:"checks"`
	Errors                 int64            `json:"errors"`
	Degraded               int64            `json:"degraded"`
	AllowedRatio           float64          `json:"allowed_ratio"`
	ErrorKinds             map[string]int64 `json:"error_kinds,omitempty"`
	Load                   string           `json:"loadavg_after"`
	Round                  int              `json:"round,omitempty"` // with --rounds: which round; 0 in a median row

	rule string
}

// memRow is the memory of active keys in one system.
type memRow struct {
	System          string  `json:"system"`
	Keys            int     `json:"keys"`
	Measure         string  `json:"measure"`
	Note            string  `json:"note,omitempty"`
	BytesPerKey     float64 `json:"bytes_per_key"`
	HeapBytesPerKey float64 `json:"heap_bytes_per_key,omitempty"`
	RSSBytesPerKey  float64 `json:"rss_bytes_per_key,omitempty"`
	RSSBefore       int64   `json:"rss_before"`
	RSSAfter        int64   `json:"rss_after"`
	FillSeconds     float64 `json:"fill_s"`
}

type report struct {
	Started      time.Time `json:"started"`
	Finished     time.Time `json:"finished"`
	LoadBefore   string    `json:"loadavg_before"`
	LoadAfter    string    `json:"loadavg_after"`
	GoVersion    string    `json:"go_version"`
	CPUs         int       `json:"cpus"`
	RedisVersion string    `json:"redis_version"`
	Keys         int       `json:"keys"`
	Rule         string    `json:"rule"`
	RowSeconds   float64   `json:"row_seconds"`
	Batch        int       `json:"batch"`
	Pipeline     int       `json:"pipeline"`
	Rows         []row     `json:"rows"`
	Memory       []memRow  `json:"memory"`
	Rounds       int       `json:"rounds,omitempty"`     // > 1: each of Rows is the median of its rounds
	ServerEnv    []string  `json:"server_env,omitempty"` // --server-env: set for every ringlimit and gubernator server
	RoundRows    []row     `json:"round_rows,omitempty"` // with Rounds: every round's rows
}

// rowKey is what a row measures, whatever the round.
type rowKey struct {
	system, path, group string
	inst, conc, batch   int
}

func keyOf(x row) rowKey {
	return rowKey{x.System, x.Path, x.Group, x.Instances, x.Concurrency, x.Batch}
}

// median returns the median of xs (the mean of the middle two for an
// even count), 0 for none. It sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// medianRows folds the rows of several rounds into one row per load, in
// the order of first appearance: each rate, latency and CPU figure is the
// median of its rounds (separately: the p99 of the median row need not
// come from the round of the median throughput); counts are summed.
func medianRows(rows []row) []row {
	var order []rowKey
	groups := map[rowKey][]row{}
	for _, x := range rows {
		k := keyOf(x)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], x)
	}
	out := make([]row, 0, len(order))
	for _, k := range order {
		g := groups[k]
		m := g[len(g)-1]
		m.Round, m.ErrorKinds = 0, nil
		pick := func(f func(row) float64) float64 {
			xs := make([]float64, len(g))
			for i, x := range g {
				xs[i] = f(x)
			}
			return median(xs)
		}
		m.ChecksPerSec = pick(func(x row) float64 { return x.ChecksPerSec })
		m.P50ms = pick(func(x row) float64 { return x.P50ms })
		m.P99ms = pick(func(x row) float64 { return x.P99ms })
		m.P99SchedMs = pick(func(x row) float64 { return x.P99SchedMs })
		m.P99WakeLateMs = pick(func(x row) float64 { return x.P99WakeLateMs })
		m.CPUusPerCheck = pick(func(x row) float64 { return x.CPUusPerCheck })
		m.LoadCPUusPerCheck = pick(func(x row) float64 { return x.LoadCPUusPerCheck })
		m.ServerCPUSeconds = pick(func(x row) float64 { return x.ServerCPUSeconds })
		m.ServerSwitchesPerCheck = pick(func(x row) float64 { return x.ServerSwitchesPerCheck })
		m.ServerSyscallsPerCheck = pick(func(x row) float64 { return x.ServerSyscallsPerCheck })
		m.LoadSwitchesPerCheck = pick(func(x row) float64 { return x.LoadSwitchesPerCheck })
		m.LoadSyscallsPerCheck = pick(func(x row) float64 { return x.LoadSyscallsPerCheck })
		m.AllowedRatio = pick(func(x row) float64 { return x.AllowedRatio })
		m.Rate = pick(func(x row) float64 { return x.Rate })
		m.Checks, m.Errors, m.Degraded = 0, 0, 0
		for _, x := range g {
			m.Checks += x.Checks
			m.Errors += x.Errors
			m.Degraded += x.Degraded
			m.HTTPFallbacks += x.HTTPFallbacks
		}
		out = append(out, m)
	}
	return out
}

func (r *report) name(x row) string {
	return fmt.Sprintf("%s %d · %s", x.System, x.Instances, x.Path)
}

func (r *report) find(system string, inst int, path string, conc int) (row, bool) {
	for _, x := range r.Rows {
		if x.System == system && x.Instances == inst && x.Path == path && x.Concurrency == conc && x.Rate == 0 {
			return x, true
		}
	}
	return row{}, false
}

// ratio is a's checks/s over b's at concurrency c: with rounds, the
// median of each round's ratio (a and b measured minutes apart, not a
// round apart), and each round's, formatted; 0 when a row is missing.
func (r *report) ratio(aSys string, aInst int, aPath, bSys string, bInst int, bPath string, c int) (float64, []string) {
	if r.Rounds <= 1 {
		x, f1 := r.find(aSys, aInst, aPath, c)
		y, f2 := r.find(bSys, bInst, bPath, c)
		if !f1 || !f2 || y.ChecksPerSec == 0 {
			return 0, nil
		}
		return x.ChecksPerSec / y.ChecksPerSec, nil
	}
	var qs []float64
	var each []string
	for round := 1; round <= r.Rounds; round++ {
		var x, y row
		for _, z := range r.RoundRows {
			if z.Round != round || z.Concurrency != c || z.Rate != 0 {
				continue
			}
			if z.System == aSys && z.Instances == aInst && z.Path == aPath {
				x = z
			}
			if z.System == bSys && z.Instances == bInst && z.Path == bPath {
				y = z
			}
		}
		if x.ChecksPerSec > 0 && y.ChecksPerSec > 0 {
			q := x.ChecksPerSec / y.ChecksPerSec
			qs = append(qs, q)
			each = append(each, fmt.Sprintf("%.1f", q))
		}
	}
	return median(qs), each
}

func num(f float64) string {
	switch {
	case f >= 100:
		s := fmt.Sprintf("%.0f", f)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	case f >= 10:
		return fmt.Sprintf("%.1f", f)
	default:
		return fmt.Sprintf("%.2f", f)
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	redis := ""
	if r.RedisVersion != "" {
		redis = "; Redis " + r.RedisVersion
	}
	fmt.Fprintf(&b, "Run %s → %s (UTC), %d CPUs, %s, load average before %s, after %s%s.\n",
		r.Started.Format("2006-01-02 15:04:05"), r.Finished.Format("15:04:05"), r.CPUs, r.GoVersion, r.LoadBefore, r.LoadAfter, redis)
	fmt.Fprintf(&b, "%d uniform keys, %s; %.0fs per row; batched rows carry %d checks per call (Redis: pipeline %d).\n",
		r.Keys, r.Rule, r.RowSeconds, r.Batch, r.Pipeline)
	if len(r.ServerEnv) > 0 {
		fmt.Fprintf(&b, "Every ringlimit and gubernator server ran with %s in its environment.\n", strings.Join(r.ServerEnv, " "))
	}
	if r.Rounds > 1 {
		fmt.Fprintf(&b, "%d rounds, the systems in turn: each figure below is the median of its rounds (every round's rows are in results.json), each ratio the median of the rounds' ratios.\n", r.Rounds)
	}
	b.WriteString("\n")
	b.WriteString("| system | n | path | c | checks/call | checks/s | p50 ms | p99 ms | server CPU µs/check | load generator CPU µs/check | server switches / r-w syscalls per check | load generator switches / r-w syscalls per check | errors | degraded |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, x := range r.Rows {
		path := x.Path
		if x.Rate > 0 {
			path += fmt.Sprintf(" (paced %s calls/s; p99 from the scheduled send %.3f ms, of the load generator's wake-ups' lateness %.3f ms)", num(x.Rate), x.P99SchedMs, x.P99WakeLateMs)
		}
		if x.HTTPFallbacks > 0 {
			path += fmt.Sprintf(" (%s calls over HTTP: no view)", num(float64(x.HTTPFallbacks)))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %s | %.3f | %.3f | %.2f | %.2f | %.3f / %.3f | %.3f / %.3f | %d | %d |\n",
			x.System, x.Instances, path, x.Concurrency, x.Batch, num(x.ChecksPerSec), x.P50ms, x.P99ms, x.CPUusPerCheck, x.LoadCPUusPerCheck,
			x.ServerSwitchesPerCheck, x.ServerSyscallsPerCheck, x.LoadSwitchesPerCheck, x.LoadSyscallsPerCheck, x.Errors, x.Degraded)
	}
	if len(r.Memory) > 0 {
		b.WriteString("\n| memory | active keys | bytes per key | measured as | Go heap bytes per key | note |\n|---|--:|--:|---|--:|---|\n")
		for _, m := range r.Memory {
			heap := ""
			if m.HeapBytesPerKey > 0 {
				heap = fmt.Sprintf("%.1f", m.HeapBytesPerKey)
			}
			note := m.Note
			if m.RSSBytesPerKey > 0 {
				note = strings.TrimPrefix(note+fmt.Sprintf("; RSS delta %.0f B/key", m.RSSBytesPerKey), "; ")
			}
			fmt.Fprintf(&b, "| %s | %s | **%.1f** | %s | %s | %s |\n", m.System, num(float64(m.Keys)), m.BytesPerKey, m.Measure, heap, note)
		}
	}
	b.WriteString("\n" + r.targets())
	return b.String()
}

// targets compares the run with the targets, at every
// concurrency level the run has.
func (r *report) targets() string {
	var b strings.Builder
	b.WriteString("| target | measured | met |\n|---|---|---|\n")
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	concs := map[int]bool{}
	for _, x := range r.Rows {
		concs[x.Concurrency] = true
	}
	var cs []int
	for c := range concs {
		cs = append(cs, c)
	}
	sort.Ints(cs)
	// cpuTarget scores a CPU target at each concurrency: the issue names
	// none, and CPU per check falls as concurrency fills frames, so the
	// verdict says where it holds ("yes at c=32 only") rather than one
	// word for all.
	cpuTarget := func(label, path string, limit float64) {
		for _, n := range []int{1, 3} {
			var parts, met []string
			any := false
			for _, c := range cs {
				if x, found := r.find("ringlimit", n, path, c); found {
					any = true
					parts = append(parts, fmt.Sprintf("c=%d %.2f", c, x.CPUusPerCheck))
					if x.CPUusPerCheck <= limit {
						met = append(met, fmt.Sprintf("c=%d", c))
					}
				}
			}
			if any {
				fmt.Fprintf(&b, "| %s, %d member(s): ≤ %.1f µs | %s µs | %s |\n", label, n, limit, strings.Join(parts, ", "), metAt(met, len(parts)))
			}
		}
	}
	cpuTarget("server CPU per check, single over HTTP", "HTTP single", 8)
	cpuTarget("server CPU per check, batched over HTTP", fmt.Sprintf("HTTP batch %d", r.Batch), 0.5)
	cpuTarget("server CPU per check, data plane (Go client, batched)", fmt.Sprintf("Go client, %d per call", r.Batch), 0.3)
	cpuTarget("server CPU per check, data plane (Go client, 1 per call)", "Go client, 1 per call", 0.3)
	// ratio scores ringlimit of aInst members on aPath against bSys of
	// bInst instances on bPath, at every concurrency (or only at only).
	ratio := func(label string, aInst int, aPath, bSys string, bInst int, bPath string, want float64, only int) {
		var parts []string
		ok, any := true, false
		for _, c := range cs {
			if only > 0 && c != only {
				continue
			}
			q, rounds := r.ratio("ringlimit", aInst, aPath, bSys, bInst, bPath, c)
			if q == 0 {
				continue
			}
			any = true
			part := fmt.Sprintf("c=%d %.1f×", c, q)
			if len(rounds) > 1 {
				part += " (rounds " + strings.Join(rounds, ", ") + ")"
			}
			parts = append(parts, part)
			ok = ok && q >= want
		}
		if any {
			fmt.Fprintf(&b, "| %s ≥ %.0f× | %s | %s |\n", label, want, strings.Join(parts, ", "), yes(ok))
		}
	}
	ratio("ringlimit 3 over HTTP vs gubernator 3 over HTTP, single", 3, "HTTP single", "gubernator", 3, "HTTP single", 10, 0)
	bp := fmt.Sprintf("HTTP batch %d", r.Batch)
	ratio(fmt.Sprintf("ringlimit 3 over HTTP vs gubernator 3 over HTTP, batch %d", r.Batch), 3, bp, "gubernator", 3, bp, 10, 0)
	top := 32
	if len(cs) > 0 && !concs[32] {
		top = cs[len(cs)-1]
	}
	// The issue does not say how many members the Go client's rows use:
	// both are scored.
	for _, n := range []int{1, 3} {
		ratio(fmt.Sprintf("Go client 1 per call (ringlimit %d) vs Redis+Lua pipeline 1", n), n, "Go client, 1 per call", "redis", 1, "EVALSHA, pipeline 1", 3, top)
		ratio(fmt.Sprintf("Go client %d per call (ringlimit %d) vs Redis+Lua pipeline %d", r.Batch, n, r.Pipeline), n,
			fmt.Sprintf("Go client, %d per call", r.Batch), "redis", 1, fmt.Sprintf("EVALSHA, pipeline %d", r.Pipeline), 20, top)
	}
	for _, m := range r.Memory {
		if m.System == "ringlimit" && m.Keys >= 10_000_000 {
			fmt.Fprintf(&b, "| ≤ 24 B RSS per active key at %s keys | %.1f B (%s) | %s |\n", num(float64(m.Keys)), m.BytesPerKey, m.Note, yes(m.BytesPerKey <= 24))
		}
	}
	for _, x := range r.Rows {
		if x.Group == "forwarded" && x.Rate > 0 {
			// Scored from the scheduled send: what a caller at that rate
			// waits, queueing behind a late call included.
			fmt.Fprintf(&b, "| p99 of a forwarded single check < 1 ms at half of peak (%s) | %.3f ms from the scheduled send (%.3f ms from the send) | %s |\n",
				x.Path, x.P99SchedMs, x.P99ms, yes(x.P99SchedMs < 1))
		}
	}
	return b.String()
}

// metAt is the verdict of a target met at the levels met of n: "yes",
// "**no**", or "yes at c=8, c=32 only".
func metAt(met []string, n int) string {
	switch len(met) {
	case n:
		return "yes"
	case 0:
		return "**no**"
	}
	return "yes at " + strings.Join(met, ", ") + " only"
}

// concTicks marks the concurrency levels measured.
func concTicks[S interface{ xs() []float64 }](ss []S) plot.Ticker {
	seen := map[float64]bool{}
	var ts plot.ConstantTicks
	for _, s := range ss {
		for _, x := range s.xs() {
			if !seen[x] {
				seen[x] = true
				ts = append(ts, plot.Tick{Value: x, Label: fmt.Sprint(x)})
			}
		}
	}
	return ts
}

// plot draws four panels: checks/s and server CPU per check against
// concurrency, for single checks per call and for batched calls.
func (r *report) plot(path string) error {
	groups := map[string][]*series{}
	index := map[string]*series{}
	for _, x := range r.Rows {
		if x.Group != "single" && x.Group != "batched" {
			continue
		}
		name := r.name(x)
		s := index[name]
		if s == nil {
			s = &series{name: name}
			index[name] = s
			groups[x.Group] = append(groups[x.Group], s)
		}
		s.pts = append(s.pts, plotter.XY{X: float64(x.Concurrency), Y: math.Max(x.ChecksPerSec, 1)})
		s.cpu = append(s.cpu, plotter.XY{X: float64(x.Concurrency), Y: math.Max(x.CPUusPerCheck, 0.001)})
	}
	legends := map[string]*plot.Legend{}
	panel := func(title, ylabel, group string, ss []*series, cpu bool) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "concurrent callers"
		p.Y.Label.Text = ylabel
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, concTicks(ss)
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		leg := plot.NewLegend()
		leg.Top, leg.Left = true, true
		leg.TextStyle.Font.Size = vg.Points(10)
		for i, s := range ss {
			pts := s.pts
			if cpu {
				pts = s.cpu
			}
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			c := plotutil.Color(i)
			l.Color, sc.Color = c, c
			l.Dashes = plotutil.Dashes(i / 7)
			sc.Shape = plotutil.Shape(i)
			if strings.HasPrefix(s.name, "ringlimit") {
				l.Width = vg.Points(2)
			}
			p.Add(l, sc)
			leg.Add(s.name, l, sc)
		}
		legends[group] = &leg // the same lines in both panels of a column
		p.Add(plotter.NewGrid())
		return p, nil
	}
	var ps [2][2]*plot.Plot
	var err error
	for j, g := range []string{"single", "batched"} {
		what := "1 check per call"
		if g == "batched" {
			what = fmt.Sprintf("%d checks per call (Redis: pipeline %d)", r.Batch, r.Pipeline)
		}
		if ps[0][j], err = panel("throughput, "+what, "checks/s", g, groups[g], false); err != nil {
			return err
		}
		if ps[1][j], err = panel("server CPU per check, "+what, "µs of server CPU per check", g, groups[g], true); err != nil {
			return err
		}
	}
	const w, h, legendH = 32 * vg.Centimeter, 30 * vg.Centimeter, 6 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	plots := draw.Crop(dc, 0, 0, legendH, 0)
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{ps[0][:], ps[1][:]}, tiles, plots)
	for i := range 2 {
		for j := range 2 {
			ps[i][j].Draw(canvases[i][j])
		}
	}
	for j, g := range []string{"single", "batched"} {
		if leg := legends[g]; leg != nil {
			col := draw.Crop(dc, vg.Length(j)*w/2+vg.Centimeter, -vg.Length(1-j)*w/2, vg.Centimeter/2, -(h - legendH))
			leg.Draw(col)
		}
	}
	return writePNG(img, path)
}

// series is one line of the plot: a system and path over concurrency.
type series struct {
	name string
	pts  plotter.XYs
	cpu  plotter.XYs
}

func (s *series) xs() []float64 {
	xs := make([]float64, len(s.pts))
	for i, p := range s.pts {
		xs[i] = p.X
	}
	return xs
}
