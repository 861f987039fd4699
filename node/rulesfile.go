package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ringlimit/ringlimit/fsm"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

// appliedFile records, in the data dir, the fingerprint of the rules last
// applied from the rules file, so that a restart with an unchanged file
// does not undo a later PUT.
const appliedFile = "rules-file.applied"

// LoadRulesFile reads and validates a rules file.
func LoadRulesFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := rules.ParseFile(data); err != nil {
		return nil, err
	}
	return data, nil
}

// WatchRulesFile applies the rules file through Raft whenever its content
// differs from what this node last applied from it, checking every
// interval until ctx is done. Changed content is applied once it reads
// the same twice, rulesFileSettle apart. An invalid file, or one that
// names no rules list (rules.ParseFile), is refused whole with a log
// line; the rules in force stay.
func (n *Node) WatchRulesFile(ctx context.Context, path string, interval time.Duration) {
	n.WatchRulesFileWith(ctx, path, interval, RulesFileHooks{})
}

// RulesFileHooks let a process whose file holds more than rules (an
// embedded gateway's --config: rules and routes) take each version of
// the file whole: refused whole, or in force whole.
type RulesFileHooks struct {
	// Parse reads a version of the file and returns its written rules;
	// an error refuses it whole (logged, ringlimit_rules_file_last_load_ok
	// 0; the rules in force stay). nil = rules.ParseFile.
	Parse func(data []byte) ([]limiter.Rule, error)
	// Before is called with a version of the file, parsed by Parse
	// without error, before its rules are written (or found in force):
	// what must not outlive the rules in force now, and can go first,
	// goes (an embedded gateway's routes, restricted to the rules in
	// force, so that a rule removed with its route is never checked
	// through that route). It runs on the watcher's goroutine and must
	// not block. nil = nothing.
	Before func(data []byte)
	// InForce is called with a version of the file, parsed by Parse
	// without error, once its rules are in force on this member (applied
	// now, found in force already, or replaced by a later write: see
	// applyRulesFile); never for a refused one. It runs on the watcher's
	// goroutine and must not block.
	InForce func(data []byte)
}

// WatchRulesFileWith is WatchRulesFile reading the file with h.
func (n *Node) WatchRulesFileWith(ctx context.Context, path string, interval time.Duration, h RulesFileHooks) {
	n.watchRulesFile(ctx, path, interval, func(ctx context.Context, path string, data []byte) bool {
		return n.applyRulesFileWith(ctx, path, data, h)
	})
}

// watchRulesFile is WatchRulesFile applying each version with apply
// (applyRulesFile; tests give their own), which reports whether to try
// again.
func (n *Node) watchRulesFile(ctx context.Context, path string, interval time.Duration, apply func(ctx context.Context, path string, data []byte) (retry bool)) {
	var seen [32]byte // content last looked at
	pending := false  // valid content not applied yet (no leader, say)
	n.rulesFilePending.Store(true)
	n.rulesFileStart.Store(true)
	defer n.rulesFilePending.Store(false)
	if err := n.registerRulesFileMetrics(); err != nil {
		n.log.Error("rules file metrics", "err", err)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	// While pending at start: soon, then less often, up to maxRetry. Each
	// try parses the file again and may forward it to the leader; at a
	// fixed 50 ms a 10,000-rule file took most of a core while a start
	// waited (audit). Not longer: the file's rules must be in force soon
	// after a leader appears (a cap at the watch interval, 1 s, left a
	// new cluster answering its rules 404 for up to a second after its
	// members were active: the Compose test).
	const firstRetry, maxRetry = 50 * time.Millisecond, 200 * time.Millisecond
	retryEvery := firstRetry
	retry := time.NewTimer(retryEvery)
	defer retry.Stop()
	var settling [32]byte // changed content read once, to be read again
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	for {
		var settleC <-chan time.Time
		data, err := os.ReadFile(path)
		switch sum := sha256.Sum256(data); {
		case err != nil:
			if sum := sha256.Sum256([]byte(err.Error())); sum != seen {
				seen = sum
				n.log.Error("cannot read the rules file; the rules in force stay", "path", path, "err", err)
				n.m.rulesFileLoaded(false)
			}
		case sum != seen && sum != settling:
			// Changed: applied only once a second read, rulesFileSettle later,
			// finds the same content, so that a file caught in the middle of
			// its write (truncated, or half written and still valid YAML:
			// some rules missing) is not applied to the whole cluster.
			settling = sum
			settle.Reset(rulesFileSettle(interval))
			settleC = settle.C
		case sum != seen || pending:
			seen, settling = sum, [32]byte{}
			if pending = apply(ctx, path, data); !pending {
				n.rulesFileStart.Store(false)
			}
		}
		if !pending && settleC == nil {
			// In force (or refused, and the rules in force stay): ready.
			n.rulesFilePending.Store(false)
		}
		wait := tick.C
		retrying := pending && n.rulesFilePending.Load()
		if retrying {
			retry.Reset(retryEvery) // Go 1.23+: no stale fire follows a Reset
			wait = retry.C          // not ready until it is in force: try again soon
			retryEvery = min(2*retryEvery, maxRetry)
		} else {
			retryEvery = firstRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-wait:
		case <-settleC:
		}
	}
}

// rulesFileSettle is how long WatchRulesFile waits to read changed
// content again before applying it: 100 ms, or the interval if shorter.
func rulesFileSettle(interval time.Duration) time.Duration {
	return min(100*time.Millisecond, interval)
}

// applyRulesFile applies one version of the file; it reports whether it
// must be tried again. The watcher's ctx does not bound it (see below).
func (n *Node) applyRulesFile(ctx context.Context, path string, data []byte) (retry bool) {
	return n.applyRulesFileWith(ctx, path, data, RulesFileHooks{})
}

// applyRulesFileWith is applyRulesFile reading the file with h.
func (n *Node) applyRulesFileWith(_ context.Context, path string, data []byte, h RulesFileHooks) (retry bool) {
	parse := h.Parse
	if parse == nil {
		parse = rules.ParseFile
	}
	loaded := func() {
		n.m.rulesFileLoaded(true)
		if h.InForce != nil {
			h.InForce(data)
		}
	}
	written, err := parse(data)
	if err != nil {
		n.log.Error("rules file refused; the rules in force stay", "path", path, "err", err)
		n.m.rulesFileLoaded(false)
		return false
	}
	if h.Before != nil {
		h.Before(data)
	}
	fp := rules.Fingerprint(written)
	marker := filepath.Join(n.cfg.DataDir, appliedFile)
	// The marker is for a start only: content seen again after other
	// content while running is a change, applied like any other. Was:
	// skipped whenever it matched the marker, so a file edited to invalid,
	// then put back as it was, left a later PUT in force without a word.
	// markerIdx: the rules write in force when this member last applied
	// its file.
	last, err := os.ReadFile(marker)
	mfp, markerIdx, hasIdx := parseRulesMarker(string(last))
	if err == nil && n.rulesFileStart.Load() {
		switch {
		case mfp != fp:
		case !hasIdx: // a marker of the release before
			loaded()
			return false // unchanged since we applied it: a later PUT stays in force
		case !n.caughtUp() || n.View() == nil:
			return true // the log is still replaying: compare once it is in
		case n.fsm.State().RulesIndex >= markerIdx:
			loaded()
			return false // unchanged since we applied it: a later PUT stays in force
		}
		// The Raft state is older than the write that put the file's
		// content in force (raft.db restored from a backup): apply it.
		// Was: skipped for the marker alone, the file's rules never
		// applied.
	}
	if !n.caughtUp() || n.View() == nil {
		return true // the log is still replaying: the file may already be in it
	}
	if sameInForce(n.fsm.State().Rules, written) {
		// In force already: another member with the same file wrote it
		// (every member watches its own copy), or a PUT did. Writing it
		// again would only bump the rules version once per member.
		n.recordRulesFile(marker, fp)
		loaded()
		return false
	}
	switch at, ok := n.rulesWrittenAfter(written, markerIdx); {
	case ok && at > n.fsm.State().RulesIndex:
		// Written by another member a moment ago and not applied here
		// yet: compare once it is. Was: taken for a write since replaced.
		return true
	case ok:
		// The cluster had the file's rules in force at index at, after
		// this member last applied its file, and a later write replaced
		// them: this member was away (or is new) when the file changed,
		// or its copy of the file changed later than the others' (a
		// Kubernetes ConfigMap reaches each pod up to a minute apart),
		// and the others applied it then. Was: applied again over that
		// later write, for the whole cluster — at a start (a member
		// restarted after a PUT) and, while running, by the member whose
		// copy changed last. Rules written before the marker's write
		// are older content put back: a change, applied.
		n.log.Info("rules file applied by the cluster already; the later rules write in force stays",
			"path", path, "applied_at", at, "rules_version", n.fsm.State().RulesIndex)
		n.recordRulesFile(marker, fp)
		loaded()
		return false
	}
	// The watcher's stop (its ctx done) does not cut the write short: once
	// proposed it may land, and a write that lands unrecorded in the
	// marker is applied again at the next start, over any PUT since. Was:
	// the stop ended the write's wait for its view, and the marker was
	// never written. The write is bounded by its timeout and by Close.
	actx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	defer cancel()
	if _, err := n.PutRules(actx, written); err != nil {
		if errors.Is(err, rules.ErrInvalid) {
			n.log.Error("rules file refused; the rules in force stay", "path", path, "err", err)
			n.m.rulesFileLoaded(false)
			return false
		}
		n.log.Warn("rules file not applied yet; will retry", "path", path, "err", err)
		return true
	}
	n.recordRulesFile(marker, fp)
	n.log.Info("rules file applied", "path", path, "rules", len(written))
	loaded()
	return false
}

// rulesWrittenAfter returns the Raft index of the last rules write in
// the local log after index since that wrote rs (compared as the rules
// in force are), and whether there is one. Only the log kept since the
// last snapshot is read, from its end down to since: a write compacted
// away is not found. It runs when the file changes, not per check.
func (n *Node) rulesWrittenAfter(rs []limiter.Rule, since uint64) (uint64, bool) {
	logs := n.raft.logs
	if logs == nil {
		return 0, false
	}
	first, err1 := logs.FirstIndex()
	last, err2 := logs.LastIndex()
	if err1 != nil || err2 != nil {
		return 0, false
	}
	want := inForceFingerprint(rs)
	for i := last; i >= first && i > since && i > 0; i-- {
		var l raft.Log
		if logs.GetLog(i, &l) != nil || l.Type != raft.LogCommand {
			continue
		}
		if w, ok := fsm.WrittenRules(l.Data); ok && inForceFingerprint(w) == want {
			return i, true
		}
	}
	return 0, false
}

// recordRulesFile writes fp, the fingerprint of the rules file's content
// now in force, and the Raft index of the rules write in force, to the
// data dir's marker.
func (n *Node) recordRulesFile(marker, fp string) {
	line := fp + " " + strconv.FormatUint(n.fsm.State().RulesIndex, 10) + "\n"
	// Whole or not at all: a marker cut short by a crash reads as no
	// marker, and the file would be applied again over a later PUT.
	if err := writeFileAtomic(filepath.Dir(marker), filepath.Base(marker), []byte(line), 0o644); err != nil {
		n.log.Error("recording the applied rules file", "err", err)
	}
}

// parseRulesMarker reads a marker line: "FINGERPRINT INDEX", or a
// fingerprint alone (the release before).
func parseRulesMarker(s string) (fp string, index uint64, hasIndex bool) {
	fields := strings.Fields(s)
	switch {
	case len(fields) == 2:
		if i, err := strconv.ParseUint(fields[1], 10, 64); err == nil {
			return fields[0], i, true
		}
	case len(fields) == 1:
		return fields[0], 0, false
	}
	return "", 0, false
}
