package deploy

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// prometheusRule is the part of the Prometheus Operator's
// monitoring.coreos.com/v1 PrometheusRule these manifests use, decoded
// strictly: a misspelt field would be ignored by the operator.
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

// ruleGroup is a Prometheus rule group, as in a rules file.
type ruleGroup struct {
	Name     string      `json:"name"`
	Interval string      `json:"interval,omitempty"`
	Rules    []alertRule `json:"rules"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// alertCase is one promtool unit test of an alert: the series scraped
// (promtool's expanding notation, one sample per 15 s) and the labels of
// the alerts firing at at (none: the alert must stay quiet).
type alertCase struct {
	alert  string
	series map[string]string
	at     string
	fire   []map[string]string
}

// ns and the pods are the labels the Prometheus Operator puts on what a
// ServiceMonitor scrapes.
const ns = `namespace="rl"`

func pod(n string) string { return ns + `,pod="ringlimit-` + n + `"` }

// alertCases holds, for every alert, at least one case that fires it
// and one that must not.
var alertCases = []alertCase{
	{"RinglimitMembersMissing", map[string]string{
		`up{job="ringlimit-peers",` + pod("0") + `}`: "1x10", `up{job="ringlimit-peers",` + pod("1") + `}`: "0x10", `up{job="ringlimit-peers",` + pod("2") + `}`: "0x10",
	}, "3m", []map[string]string{{"namespace": "rl"}}},
	{"RinglimitMembersMissing", map[string]string{ // nothing scraped at all
		`up{job="ringlimit-router",` + pod("r") + `}`: "1x20",
	}, "3m", []map[string]string{{}}}, // absent() of a comparison carries no labels
	{"RinglimitMembersMissing", map[string]string{
		`up{job="ringlimit-peers",` + pod("0") + `}`: "1x10", `up{job="ringlimit-peers",` + pod("1") + `}`: "1x10", `up{job="ringlimit-peers",` + pod("2") + `}`: "0x10",
	}, "3m", nil},

	{"RinglimitNoLeader", map[string]string{
		`ringlimit_raft_state{` + pod("0") + `}`: "0x10", `ringlimit_raft_state{` + pod("1") + `}`: "1x10", `ringlimit_raft_state{` + pod("2") + `}`: "3x10",
	}, "2m", []map[string]string{{"namespace": "rl"}}},
	{"RinglimitNoLeader", map[string]string{
		`ringlimit_raft_state{` + pod("0") + `}`: "0x10", `ringlimit_raft_state{` + pod("1") + `}`: "2x10",
	}, "2m", nil},

	{"RinglimitMemberCannotAnswer", map[string]string{
		`ringlimit_lease_seconds_remaining{` + pod("1") + `}`: "0x10", `ringlimit_lease_seconds_remaining{` + pod("0") + `}`: "3.5x10",
	}, "2m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-1"}}},
	{"RinglimitMemberCannotAnswer", map[string]string{ // a single member needs no lease: +Inf
		`ringlimit_lease_seconds_remaining{` + pod("0") + `}`: strings.Repeat("Inf ", 10),
	}, "2m", nil},
	{"RinglimitMemberCannotAnswer", map[string]string{ // a lease lost for less than a minute
		`ringlimit_lease_seconds_remaining{` + pod("0") + `}`: "3.5x4 0x2 3.5x4",
	}, "2m", nil},

	{"RinglimitMemberDead", map[string]string{
		`ringlimit_members{state="dead",` + pod("0") + `}`: "1x10", `ringlimit_members{state="dead",` + pod("1") + `}`: "0x10",
	}, "2m", []map[string]string{{"namespace": "rl"}}},
	{"RinglimitMemberDead", map[string]string{
		`ringlimit_members{state="dead",` + pod("0") + `}`: "0x10", `ringlimit_members{state="down",` + pod("0") + `}`: "1x10",
	}, "2m", nil},

	{"RinglimitMemberDownTooLong", map[string]string{
		`ringlimit_members{state="down",` + pod("0") + `}`: "1x80",
	}, "16m", []map[string]string{{"namespace": "rl"}}},
	{"RinglimitMemberDownTooLong", map[string]string{ // a restart that came back within 10 minutes
		`ringlimit_members{state="down",` + pod("0") + `}`: "1x40 0x40",
	}, "16m", nil},

	{"RinglimitRulesDiverge", map[string]string{
		`ringlimit_rules_version{` + pod("0") + `}`: "7x40", `ringlimit_rules_version{` + pod("1") + `}`: "7x40", `ringlimit_rules_version{` + pod("2") + `}`: "6x40",
	}, "6m", []map[string]string{{"namespace": "rl"}}},
	{"RinglimitRulesDiverge", map[string]string{ // one member a minute behind a write
		`ringlimit_rules_version{` + pod("0") + `}`: "7x40", `ringlimit_rules_version{` + pod("1") + `}`: "6x4 7x36",
	}, "6m", nil},

	{"RinglimitRulesFileRefused", map[string]string{
		`ringlimit_rules_file_last_load_ok{` + pod("2") + `}`: "1x2 0x10",
	}, "2m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-2"}}},
	{"RinglimitRulesFileRefused", map[string]string{
		`ringlimit_rules_file_last_load_ok{` + pod("2") + `}`: "1x10",
	}, "2m", nil},

	{"RinglimitBudgetsReset", map[string]string{
		`ringlimit_partitions_served_from_nothing_total{` + pod("1") + `}`: "0x20 3x60",
	}, "7m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-1"}}},
	{"RinglimitBudgetsReset", map[string]string{ // nothing served bare
		`ringlimit_partitions_served_from_nothing_total{` + pod("1") + `}`: "0x60",
	}, "7m", nil},
	{"RinglimitBudgetsReset", map[string]string{ // long ago
		`ringlimit_partitions_served_from_nothing_total{` + pod("1") + `}`: "0x4 3x100",
	}, "25m", nil},

	{"RinglimitHandoffStuck", map[string]string{
		`ringlimit_awaiting_partitions{` + pod("0") + `}`: "2x40", `ringlimit_handoff_pending_partitions{` + pod("0") + `}`: "0x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0"}}},
	{"RinglimitHandoffStuck", map[string]string{
		`ringlimit_awaiting_partitions{` + pod("1") + `}`: "0x40", `ringlimit_handoff_pending_partitions{` + pod("1") + `}`: "5x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-1"}}},
	{"RinglimitHandoffStuck", map[string]string{ // a hand-off that took 30 s
		`ringlimit_awaiting_partitions{` + pod("0") + `}`: "2x2 0x38", `ringlimit_handoff_pending_partitions{` + pod("1") + `}`: "2x2 0x38",
	}, "6m", nil},

	{"RinglimitBackupLagging", map[string]string{
		`ringlimit_backup_lag_seconds{` + pod("0") + `}`: "1.5x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0"}}},
	{"RinglimitBackupLagging", map[string]string{
		`ringlimit_backup_lag_seconds{` + pod("0") + `}`: "0.005x40",
	}, "6m", nil},

	{"RinglimitBackupErrors", map[string]string{
		`ringlimit_backup_errors_total{` + pod("0") + `}`: "0+1x60",
	}, "12m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0"}}},
	{"RinglimitBackupErrors", map[string]string{ // errors long ago, none since
		`ringlimit_backup_errors_total{` + pod("0") + `}`: "5x60",
	}, "12m", nil},

	{"RinglimitChecksDegraded", map[string]string{
		`ringlimit_degraded_total{rule="api",` + pod("0") + `}`:                    "0+10x40",
		`ringlimit_decisions_total{rule="api",outcome="allowed",` + pod("0") + `}`: "0+90x40",
		`ringlimit_decisions_total{rule="api",outcome="denied",` + pod("0") + `}`:  "0+10x40",
	}, "6m", []map[string]string{{"namespace": "rl", "rule": "api"}}},
	{"RinglimitChecksDegraded", map[string]string{ // 0.1% degraded
		`ringlimit_degraded_total{rule="api",` + pod("0") + `}`:                    "0+1x40",
		`ringlimit_decisions_total{rule="api",outcome="allowed",` + pod("0") + `}`: "0+1000x40",
	}, "6m", nil},

	{"RinglimitForwardErrors", map[string]string{
		`ringlimit_forward_errors_total{` + pod("0") + `}`: "0+3x60",
	}, "14m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0"}}}, // rate() over 5m of a counter from 0 reaches 0.2/s after 5m
	{"RinglimitForwardErrors", map[string]string{
		`ringlimit_forward_errors_total{` + pod("0") + `}`: "0+1x60",
	}, "14m", nil},

	{"RinglimitKeyCapReached", map[string]string{
		`ringlimit_key_cap_refused_total{` + pod("1") + `}`: "0+5x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-1"}}},
	{"RinglimitKeyCapReached", map[string]string{
		`ringlimit_key_cap_refused_total{` + pod("1") + `}`: "3x40",
	}, "6m", nil},

	{"RinglimitCheckLatencyHigh", map[string]string{ // half the checks over 10 ms
		`ringlimit_check_duration_seconds_bucket{le="0.001",job="ringlimit-router",` + pod("r") + `}`: "0+100x60",
		`ringlimit_check_duration_seconds_bucket{le="0.01",job="ringlimit-router",` + pod("r") + `}`:  "0+100x60",
		`ringlimit_check_duration_seconds_bucket{le="0.1",job="ringlimit-router",` + pod("r") + `}`:   "0+200x60",
		`ringlimit_check_duration_seconds_bucket{le="+Inf",job="ringlimit-router",` + pod("r") + `}`:  "0+200x60",
	}, "12m", []map[string]string{{"namespace": "rl", "job": "ringlimit-router"}}},
	{"RinglimitCheckLatencyHigh", map[string]string{
		`ringlimit_check_duration_seconds_bucket{le="0.001",job="ringlimit-router",` + pod("r") + `}`: "0+200x60",
		`ringlimit_check_duration_seconds_bucket{le="0.01",job="ringlimit-router",` + pod("r") + `}`:  "0+200x60",
		`ringlimit_check_duration_seconds_bucket{le="+Inf",job="ringlimit-router",` + pod("r") + `}`:  "0+200x60",
	}, "12m", nil},

	{"RinglimitViewUnreadable", map[string]string{
		`ringlimit_router_view_errors_total{` + pod("r") + `}`: "0+15x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-r"}}},
	{"RinglimitViewUnreadable", map[string]string{ // one failed read in a while
		`ringlimit_router_view_errors_total{` + pod("r") + `}`: "0+1x4 4x36",
	}, "6m", nil},

	{"RinglimitPeersFailAuth", map[string]string{
		`ringlimit_listener_refused_total{listener="peer",reason="auth",` + pod("0") + `}`: "0+1x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0", "listener": "peer"}}},
	{"RinglimitPeersFailAuth", map[string]string{ // refused at the connection cap, not for the secret
		`ringlimit_listener_refused_total{listener="peer",reason="cap",` + pod("0") + `}`: "0+1x40",
	}, "6m", nil},

	{"RinglimitGatewayErrors", map[string]string{ // a route whose rule was removed: every request 500
		`ringlimit_gateway_requests_total{route="api",outcome="error",` + pod("g") + `}`:   "0+60x40",
		`ringlimit_gateway_requests_total{route="api",outcome="allowed",` + pod("g") + `}`: "0+600x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-g", "route": "api"}}},
	{"RinglimitGatewayErrors", map[string]string{ // denials are not errors
		`ringlimit_gateway_requests_total{route="api",outcome="denied",` + pod("g") + `}`:  "0+60x40",
		`ringlimit_gateway_requests_total{route="api",outcome="allowed",` + pod("g") + `}`: "0+600x40",
	}, "6m", nil},

	{"RinglimitGatewayUpstreamFailing", map[string]string{
		`ringlimit_gateway_upstream_errors_total{status="502",` + pod("g") + `}`: "0+60x40",
		`ringlimit_gateway_upstream_errors_total{status="504",` + pod("g") + `}`: "0x40",
	}, "6m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-g", "status": "502"}}},
	{"RinglimitGatewayUpstreamFailing", map[string]string{ // one in a while
		`ringlimit_gateway_upstream_errors_total{status="502",` + pod("g") + `}`: "0+1x40",
	}, "6m", nil},

	{"RinglimitEnvoyConfigRefused", map[string]string{
		`ringlimit_rls_config_last_load_ok{` + pod("0") + `}`: "0x10",
	}, "2m", []map[string]string{{"namespace": "rl", "pod": "ringlimit-0"}}},
	{"RinglimitEnvoyConfigRefused", map[string]string{
		`ringlimit_rls_config_last_load_ok{` + pod("0") + `}`: "1x10",
	}, "2m", nil},
}

// TestPrometheusRule checks the alerts' shape, that every metric they
// read is one ringlimit exports, and that each has a firing and a quiet
// case in alertCases.
func TestPrometheusRule(t *testing.T) {
	m := loadBase(t)
	if len(m.alerts) != 1 {
		t.Fatalf("%d PrometheusRules in the base, want 1", len(m.alerts))
	}
	exported := exportedMetrics(t)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, c := range alertCases {
		if len(c.fire) > 0 {
			fires[c.alert] = true
		} else {
			quiet[c.alert] = true
		}
	}
	seen := map[string]bool{}
	metricName := regexp.MustCompile(`ringlimit_[a-z_]+`)
	for _, g := range m.alerts[0].Spec.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert
			switch {
			case !strings.HasPrefix(r.Alert, "Ringlimit"):
				t.Errorf("%s: alert names start with Ringlimit", where)
			case seen[r.Alert]:
				t.Errorf("%s: alert named twice", where)
			case r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning":
				t.Errorf("%s: severity %q, want critical or warning", where, r.Labels["severity"])
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				t.Errorf("%s: wants a summary and a description", where)
			case !fires[r.Alert] || !quiet[r.Alert]:
				t.Errorf("%s: alertCases needs a case that fires it and one that does not (fires %v, quiet %v)", where, fires[r.Alert], quiet[r.Alert])
			}
			seen[r.Alert] = true
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: for %q: want a positive duration", where, r.For)
			}
			for _, name := range metricName.FindAllString(r.Expr, -1) {
				if !exported[strings.TrimSuffix(name, "_bucket")] {
					t.Errorf("%s reads %s, which no ringlimit package exports", where, name)
				}
			}
		}
	}
	for _, c := range alertCases {
		if !seen[c.alert] {
			t.Errorf("alertCases tests %s, which the PrometheusRule does not define", c.alert)
		}
	}
}

// exportedMetrics returns the metric names registered in the module's
// non-test Go files (the string literals "ringlimit_…").
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	lit := regexp.MustCompile(`"(ringlimit_[a-z_]+)"`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bench" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(data, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in the module's sources", len(names))
	}
	return names
}

// TestAlertsWithPromtool runs the PrometheusRule's groups through
// `promtool check rules` and every case of alertCases through `promtool
// test rules`: each alert fires where it should, with the labels it
// should, and stays quiet where it should. .ci/run installs promtool
// (Debian's prometheus package).
func TestAlertsWithPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (apt-get install prometheus): the alerts' expressions are not evaluated")
	}
	m := loadBase(t)
	if len(m.alerts) != 1 {
		t.Fatalf("%d PrometheusRules in the base, want 1", len(m.alerts))
	}
	rules := map[string]ruleOf{}
	for _, g := range m.alerts[0].Spec.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = ruleOf{r}
		}
	}
	dir := t.TempDir()
	write := func(name string, v any) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	rulesFile := write("rules.yml", map[string]any{"groups": m.alerts[0].Spec.Groups})
	promtool(t, bin, "check", "rules", rulesFile)

	type series struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	type expAlert struct {
		Labels      map[string]string `json:"exp_labels"`
		Annotations map[string]string `json:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string     `json:"eval_time"`
		Alertname string     `json:"alertname"`
		ExpAlerts []expAlert `json:"exp_alerts"`
	}
	type test struct {
		Name      string      `json:"name"`
		Interval  string      `json:"interval"`
		Series    []series    `json:"input_series"`
		AlertTest []alertTest `json:"alert_rule_test"`
	}
	var tests []test
	for i, c := range alertCases {
		r, ok := rules[c.alert]
		if !ok {
			t.Errorf("alertCases[%d] tests %s, which the PrometheusRule does not define", i, c.alert)
			continue
		}
		name := fmt.Sprintf("alertCases[%d] %s quiet", i, c.alert)
		if len(c.fire) > 0 {
			name = fmt.Sprintf("alertCases[%d] %s fires", i, c.alert)
		}
		tc := test{Name: name, Interval: "15s"}
		for _, s := range slices.Sorted(maps.Keys(c.series)) {
			tc.Series = append(tc.Series, series{s, c.series[s]})
		}
		at := alertTest{EvalTime: c.at, Alertname: c.alert, ExpAlerts: []expAlert{}}
		for _, l := range c.fire {
			at.ExpAlerts = append(at.ExpAlerts, expAlert{r.labels(l), r.Annotations})
		}
		tc.AlertTest = []alertTest{at}
		tests = append(tests, tc)
	}
	testFile := write("alerts_test.yml", map[string]any{
		"rule_files": []string{"rules.yml"}, "evaluation_interval": "15s", "tests": tests})
	promtool(t, bin, "test", "rules", testFile)
}

type ruleOf struct{ alertRule }

// labels is what an alert of r firing with the series labels l carries.
func (r ruleOf) labels(l map[string]string) map[string]string {
	out := maps.Clone(l)
	maps.Copy(out, r.Labels)
	return out
}

// promtool runs promtool with args and fails t with its output when it
// fails.
func promtool(t *testing.T, bin string, args ...string) {
	t.Helper()
	if out, err := run(t.Context(), time.Minute, nil, bin, args...); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
