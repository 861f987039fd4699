package repeats

import (
	"testing"
	"time"
)

func TestRepeats(t *testing.T) {
	s := time.Second
	r := New(30*s, 3)
	for i, step := range []struct {
		at       time.Duration
		key      string
		wantLog  bool
		wantHeld int
	}{
		{0, "a", true, 0},
		{1 * s, "a", false, 0},
		{2 * s, "b", true, 0}, // another key: its own window
		{29 * s, "a", false, 0},
		{30 * s, "a", true, 2}, // the window has passed: logged with the count
		{31 * s, "a", false, 0},
		{32 * s, "b", true, 0},  // nothing held: logged plainly
		{10 * s, "a", false, 0}, // the clock went back: within the window
		{59 * s, "a", false, 0},
		{60 * s, "a", true, 3},
		{200 * s, "a", true, 0},
		// Bounded: a third key fits, a fourth makes room by forgetting
		// the keys whose window has passed (b, since 32s), a fifth finds
		// none and is logged without being remembered.
		{201 * s, "c", true, 0},
		{202 * s, "c", false, 0},
		{203 * s, "d", true, 0},
		{204 * s, "e", true, 0},
		{205 * s, "e", true, 0},
		{206 * s, "d", false, 0},
	} {
		log, held := r.SeeAt(step.key, step.at)
		if log != step.wantLog || held != step.wantHeld {
			t.Errorf("step %d: SeeAt(%q, %v) = %v, %d, want %v, %d", i, step.key, step.at, log, held, step.wantLog, step.wantHeld)
		}
	}
	if len(r.seen) > 3 {
		t.Errorf("%d keys remembered, want at most 3", len(r.seen))
	}
}

// The owner of a Repeats ends each window (EndAt, when Left says): the
// count held is reported then and starts the next window.
func TestRepeatsEndAt(t *testing.T) {
	s := time.Second
	r := New(30*s, 2)
	for i, step := range []struct {
		op       string // "see", "end" (endAt) or "left"
		at       time.Duration
		key      string
		wantLog  bool          // see
		wantHeld int           // see, end
		wantLeft time.Duration // end, left
	}{
		{"see", 0, "a", true, 0, 0},
		{"end", 10 * s, "a", false, 0, 20 * s}, // not over: nothing changes
		{"see", 5 * s, "a", false, 0, 0},
		{"left", 5 * s, "a", false, 0, 25 * s},
		{"end", 30 * s, "a", false, 1, 0}, // over: reported, a new window from 30s
		{"see", 40 * s, "a", false, 0, 0},
		{"see", 59 * s, "a", false, 0, 0},
		{"end", 61 * s, "a", false, 2, 0}, // a late owner: a new window from 61s
		{"end", 70 * s, "a", false, 0, 21 * s},
		{"end", 91 * s, "a", false, 0, 0}, // over with nothing held
		{"see", 92 * s, "a", true, 0, 0},
		{"left", 80 * s, "a", false, 0, 30 * s}, // the clock went back: at most a window
		{"see", 100 * s, "a", false, 0, 0},
		{"see", 130 * s, "a", true, 1, 0}, // a line before the owner ended the window reports it
		{"end", 131 * s, "a", false, 0, 29 * s},
		{"end", 131 * s, "b", false, 0, 0}, // unknown
		{"left", 131 * s, "b", false, 0, 0},
		// Bounded: the keys whose window passed with lines held are not
		// forgotten to make room (they are about to be reported).
		{"see", 140 * s, "a", false, 0, 0},
		{"see", 141 * s, "b", true, 0, 0},
		{"see", 200 * s, "c", true, 0, 0}, // b is forgotten, a is kept
		{"see", 201 * s, "d", true, 0, 0}, // no room: logged, not remembered
		{"see", 202 * s, "d", true, 0, 0},
		{"end", 203 * s, "a", false, 1, 0},
	} {
		var log bool
		var held int
		var left time.Duration
		switch step.op {
		case "see":
			log, held = r.SeeAt(step.key, step.at)
		case "end":
			held, left = r.EndAt(step.key, step.at)
		case "left":
			left = r.Left(step.key, step.at)
		}
		if log != step.wantLog || held != step.wantHeld || left != step.wantLeft {
			t.Errorf("step %d: %s(%q, %v) = log %v, held %d, left %v; want %v, %d, %v", i, step.op, step.key, step.at, log, held, left, step.wantLog, step.wantHeld, step.wantLeft)
		}
	}
}
