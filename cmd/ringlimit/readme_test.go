package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/rules"
)

// readmeSection returns the text of README.md's "## title" section, its
// subsections included.
func readmeSection(t *testing.T, readme, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

var flagLine = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

// Every flag of every command is named in the README section that
// documents the command (a user once found --log-level, certs and
// bench's flags missing there).
func TestREADMENamesEveryFlag(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	for _, c := range []struct{ cmd, section string }{
		{"serve", "Command line"}, {"check", "Command line"}, {"status", "Command line"},
		{"leave", "Command line"}, {"bench", "Command line"}, {"certs", "Command line"},
		{"router", "Router"}, {"gateway", "Gateway"},
	} {
		var out bytes.Buffer
		if exit := run(context.Background(), []string{c.cmd, "-h"}, func(string) string { return "" }, &out, &out); exit != 0 {
			t.Fatalf("%s -h: exit %d: %s", c.cmd, exit, out.String())
		}
		flags := flagLine.FindAllStringSubmatch(out.String(), -1)
		if len(flags) == 0 {
			t.Fatalf("%s -h lists no flags: %s", c.cmd, out.String())
		}
		sec := readmeSection(t, readme, c.section)
		if !strings.Contains(sec, "ringlimit "+c.cmd) {
			t.Errorf("README section %q does not show `ringlimit %s`", c.section, c.cmd)
		}
		for _, f := range flags {
			if !regexp.MustCompile(`--` + regexp.QuoteMeta(f[1]) + `([^a-z0-9-]|$)`).MatchString(sec) {
				t.Errorf("ringlimit %s --%s is not in README's %q section", c.cmd, f[1], c.section)
			}
		}
	}
	if !strings.Contains(usage, "ringlimit certs") {
		t.Error("the usage text does not list certs")
	}
}

// metricName matches where a metric is named in the code: an Opts' Name
// or a Desc's first argument.
var metricName = regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(ringlimit_[a-z0-9_]+)"`)

// Every metric the code defines is named in README's Metrics section (a
// user once looked there for the lease and the rules version and found
// neither).
func TestREADMENamesEveryMetric(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := readmeSection(t, string(data), "Metrics")
	seen := map[string]bool{}
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bench" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "../.." {
			return filepath.SkipDir // bench is a module of its own, with others' metrics
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(src), -1) {
			seen[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d metrics in the code: %v", len(seen), seen)
	}
	for name := range seen {
		if !regexp.MustCompile("`" + name + "[`{]").MatchString(sec) {
			t.Errorf("metric %s is not in README's Metrics section", name)
		}
	}
}

// The README's gateway configuration (its yaml block with rules: and
// routes:) loads as the gateway loads it: its rules parse, its routes
// parse, and every route names rules it defines (or default). A user
// copies it first; a field renamed in the code and not there failed at
// their gateway's start.
func TestREADMEGatewayExampleLoads(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := readmeSection(t, string(data), "Gateway")
	var doc string
	for _, block := range strings.Split(section, "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, "\nroutes:\n") && strings.HasPrefix(block, "rules:\n") {
			doc = block
		}
	}
	if doc == "" {
		t.Fatal("the Gateway section has no yaml block of rules: and routes:")
	}
	set, err := rules.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("its rules: %v", err)
	}
	routes, err := rules.ParseRoutes([]byte(doc))
	if err != nil {
		t.Fatalf("its routes: %v", err)
	}
	if err := rules.CheckRoutes(routes, rules.Effective(set)); err != nil {
		t.Fatalf("its routes against its rules: %v", err)
	}
	if len(routes) < 5 {
		t.Fatalf("%d routes read; want the whole example", len(routes))
	}
}
