package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/ringlimit/ringlimit/rules"
)

const base = "k8s/base"

// kustomization is the part of kustomize's Kustomization these manifests
// use; decoding strictly catches a field kustomize would not know either.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// manifests holds every object of the base, decoded strictly.
type manifests struct {
	sts      []*appsv1.StatefulSet
	deploys  []*appsv1.Deployment
	services []*corev1.Service
	cms      []*corev1.ConfigMap
	secrets  []*corev1.Secret
	pdbs     []*policyv1.PodDisruptionBudget
	monitors []*unstructured.Unstructured
}

func loadBase(t *testing.T) *manifests {
	t.Helper()
	var k kustomization
	readStrict(t, filepath.Join(base, "kustomization.yaml"), &k)
	if k.Kind != "Kustomization" || k.APIVersion != "kustomize.config.k8s.io/v1beta1" {
		t.Fatalf("kustomization.yaml: kind %q apiVersion %q", k.Kind, k.APIVersion)
	}
	files, _ := filepath.Glob(filepath.Join(base, "*.yaml"))
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(k.Resources, b) {
			t.Errorf("%s is not listed in kustomization.yaml resources", f)
		}
	}
	m := &manifests{}
	for _, r := range k.Resources {
		path := filepath.Join(base, r)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("kustomization.yaml lists %s: %v", r, err)
		}
		var tm struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			m.sts = append(m.sts, decode[appsv1.StatefulSet](t, path, data))
		case "apps/v1 Deployment":
			m.deploys = append(m.deploys, decode[appsv1.Deployment](t, path, data))
		case "v1 Service":
			m.services = append(m.services, decode[corev1.Service](t, path, data))
		case "v1 ConfigMap":
			m.cms = append(m.cms, decode[corev1.ConfigMap](t, path, data))
		case "v1 Secret":
			m.secrets = append(m.secrets, decode[corev1.Secret](t, path, data))
		case "policy/v1 PodDisruptionBudget":
			m.pdbs = append(m.pdbs, decode[policyv1.PodDisruptionBudget](t, path, data))
		case "monitoring.coreos.com/v1 ServiceMonitor":
			// A CRD: no Go type in k8s.io/api, so unstructured; its
			// fields are checked one by one in TestServiceMonitor.
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(data, &u.Object); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			m.monitors = append(m.monitors, u)
		default:
			t.Fatalf("%s: no decoder for %s %s; add one to this test", path, tm.APIVersion, tm.Kind)
		}
	}
	return m
}

func decode[T any](t *testing.T, path string, data []byte) *T {
	t.Helper()
	v := new(T)
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s does not decode strictly: %v", path, err)
	}
	return v
}

func readStrict(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s does not decode strictly: %v", path, err)
	}
}

var refRe = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// envOf returns the container's literal env values in order, failing on
// a $(VAR) reference to a variable not defined before it (Kubernetes
// would leave it unexpanded).
func envOf(t *testing.T, where string, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		for _, m := range refRe.FindAllStringSubmatch(e.Value, -1) {
			if _, ok := env[m[1]]; !ok {
				t.Errorf("%s: env %s refers to $(%s), not defined before it", where, e.Name, m[1])
			}
		}
		env[e.Name] = e.Value
	}
	return env
}

// expand substitutes $(VAR) as the kubelet does.
func expand(s string, vars map[string]string) string {
	return refRe.ReplaceAllStringFunc(s, func(m string) string { return vars[m[2:len(m)-1]] })
}

// notFlags are env variables a container may set that are not flags: the
// inputs of $(...) references and the Go runtime's own.
var notFlags = map[string]bool{"POD_NAME": true, "POD_NAMESPACE": true, "POD_IP": true, "GOMEMLIMIT": true, "GOMAXPROCS": true}

// checkContainer holds a container to the binary: its command exists, its
// env names are flags of that command, ports are what the flags say.
func checkContainer(t *testing.T, where string, c corev1.Container) (flags, env map[string]string) {
	t.Helper()
	if len(c.Command) > 0 {
		t.Errorf("%s: command %v overrides the image's entrypoint /ringlimit; use args", where, c.Command)
	}
	if len(c.Args) == 0 {
		t.Fatalf("%s: no args: which ringlimit command?", where)
	}
	flags, ok := flagDefaults(t, c.Args[0])
	if !ok {
		t.Fatalf("%s: the binary has no command %q", where, c.Args[0])
	}
	for _, a := range c.Args[1:] {
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		if strings.HasPrefix(a, "-") {
			if _, ok := flags[name]; !ok {
				t.Errorf("%s: arg %s: ringlimit %s has no flag --%s", where, a, c.Args[0], name)
			}
		}
	}
	env = envOf(t, where, c)
	for _, e := range c.Env {
		name, ok := strings.CutPrefix(e.Name, "RINGLIMIT_")
		if !ok {
			if !notFlags[e.Name] {
				t.Errorf("%s: env %s is neither RINGLIMIT_<FLAG> nor a known helper variable", where, e.Name)
			}
			continue
		}
		flag := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if _, ok := flags[flag]; !ok {
			t.Errorf("%s: env %s: ringlimit %s has no flag --%s", where, e.Name, c.Args[0], flag)
		}
	}
	return flags, env
}

// flagPort is the port a listen flag resolves to: its env value, else its
// default.
func flagPort(t *testing.T, where string, flags, env map[string]string, flag string) int32 {
	t.Helper()
	v, ok := env["RINGLIMIT_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))]
	if !ok {
		v = flags[flag]
	}
	i := strings.LastIndex(v, ":")
	p, err := strconv.Atoi(v[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("%s: --%s %q has no port", where, flag, v)
	}
	return int32(p)
}

func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestStatefulSet(t *testing.T) {
	m := loadBase(t)
	if len(m.sts) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(m.sts))
	}
	s := m.sts[0]
	n := startNode(t)
	where := "StatefulSet " + s.Name
	if s.Spec.Replicas == nil || *s.Spec.Replicas != 3 {
		t.Errorf("%s: replicas %v, want 3", where, s.Spec.Replicas)
	}
	if !matches(s.Spec.Selector.MatchLabels, s.Spec.Template.Labels) {
		t.Errorf("%s: selector %v does not select its pods %v", where, s.Spec.Selector.MatchLabels, s.Spec.Template.Labels)
	}
	var headless *corev1.Service
	for _, svc := range m.services {
		if svc.Name == s.Spec.ServiceName {
			headless = svc
		}
	}
	if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Fatalf("%s: serviceName %q must be a headless Service (clusterIP None) publishing not-ready addresses", where, s.Spec.ServiceName)
	}
	if !matches(headless.Spec.Selector, s.Spec.Template.Labels) {
		t.Errorf("Service %s does not select the StatefulSet's pods", headless.Name)
	}
	pod := s.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(pod.Containers))
	}
	c := pod.Containers[0]
	where += " container " + c.Name
	if c.Args[0] != "serve" {
		t.Fatalf("%s: args %v, want serve", where, c.Args)
	}
	flags, env := checkContainer(t, where, c)

	// Ports: what the listen flags say, named after the flag.
	for _, f := range []string{"http", "raft", "peer"} {
		want := flagPort(t, where, flags, env, f)
		if got, ok := containerPort(c, f); !ok || got != want {
			t.Errorf("%s: containerPort %q = %d, want %d (--%s)", where, f, got, want, f)
		}
	}
	// Probes: GET paths of the HTTP port that answer 200 on a ready node.
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", where, name)
			continue
		}
		if p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s: %s probe on port %s, want the http port", where, name, p.HTTPGet.Port.String())
		}
		if _, err := get(n.url + p.HTTPGet.Path); err != nil {
			t.Errorf("%s: %s probe path %s: %v", where, name, p.HTTPGet.Path, err)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness on %s, want /readyz", where, c.ReadinessProbe.HTTPGet.Path)
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: liveness on %s, want /healthz (readiness needs a leader; liveness must not)", where, c.LivenessProbe.HTTPGet.Path)
	}

	// Identity and addresses: id = pod name; the advertised host is the
	// pod's headless-Service name; every pod is given pod 0's address as
	// --join, which makes pod 0 (and only pod 0) the seed.
	if env["RINGLIMIT_ID"] != "$(POD_NAME)" {
		t.Errorf("%s: RINGLIMIT_ID = %q, want $(POD_NAME)", where, env["RINGLIMIT_ID"])
	}
	for _, v := range []string{"POD_NAME", "POD_NAMESPACE"} {
		want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}[v]
		found := false
		for _, e := range c.Env {
			if e.Name == v && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == want {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: env %s must come from fieldRef %s", where, v, want)
		}
	}
	httpPort := strconv.Itoa(int(flagPort(t, where, flags, env, "http")))
	for i := range 3 {
		vars := map[string]string{"POD_NAME": fmt.Sprintf("%s-%d", s.Name, i), "POD_NAMESPACE": "ns"}
		adv := expand(env["RINGLIMIT_ADVERTISE_HOST"], vars)
		if want := fmt.Sprintf("%s-%d.%s.ns.svc", s.Name, i, headless.Name); adv != want {
			t.Errorf("%s: pod %d advertises %q, want its headless-Service name %q", where, i, adv, want)
		}
		join := expand(env["RINGLIMIT_JOIN"], vars)
		if self := join == adv+":"+httpPort; self != (i == 0) {
			t.Errorf("%s: pod %d: --join %q vs own address %s:%s: seed = %v, want only pod 0", where, i, join, adv, httpPort, self)
		}
	}

	// Data on the PVC; rules from the ConfigMap, valid; secrets exist.
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm
	}
	var pvc bool
	for _, tpl := range s.Spec.VolumeClaimTemplates {
		if vm, ok := mounts[tpl.Name]; ok && vm.MountPath == env["RINGLIMIT_DATA_DIR"] {
			pvc = true
		}
	}
	if !pvc {
		t.Errorf("%s: RINGLIMIT_DATA_DIR %q is not the mount of a volumeClaimTemplate", where, env["RINGLIMIT_DATA_DIR"])
	}
	rulesChecked := false
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		vm, ok := mounts[v.Name]
		if !ok {
			t.Errorf("%s: volume %s is not mounted", where, v.Name)
			continue
		}
		cm := find(m.cms, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name })
		if cm == nil {
			t.Errorf("%s: volume %s: no ConfigMap %s", where, v.Name, v.ConfigMap.Name)
			continue
		}
		for key, data := range cm.Data {
			if vm.MountPath+"/"+key != env["RINGLIMIT_RULES"] {
				continue
			}
			rulesChecked = true
			if _, err := rules.Parse([]byte(data)); err != nil {
				t.Errorf("ConfigMap %s key %s: rules.Parse: %v", cm.Name, key, err)
			}
		}
	}
	if !rulesChecked {
		t.Errorf("%s: RINGLIMIT_RULES %q is not a key of a mounted ConfigMap", where, env["RINGLIMIT_RULES"])
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		sec := find(m.secrets, func(s *corev1.Secret) bool { return s.Name == ref.Name })
		if sec == nil {
			t.Errorf("%s: env %s: no Secret %s", where, e.Name, ref.Name)
			continue
		}
		if _, ok := sec.StringData[ref.Key]; !ok {
			if _, ok := sec.Data[ref.Key]; !ok {
				t.Errorf("%s: env %s: Secret %s has no key %s", where, e.Name, ref.Name, ref.Key)
			}
		}
	}

	// Stopping: the preStop pause plus the drain fit in the grace period.
	drain, err := time.ParseDuration(env["RINGLIMIT_DRAIN_TIMEOUT"])
	if err != nil {
		drain, err = time.ParseDuration(flags["drain-timeout"])
	}
	if err != nil {
		t.Fatalf("%s: drain timeout: %v", where, err)
	}
	var pre time.Duration
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		t.Errorf("%s: no preStop hook", where)
	} else if s := c.Lifecycle.PreStop.Sleep; s != nil {
		pre = time.Duration(s.Seconds) * time.Second
	}
	grace := pod.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= pre+drain {
		t.Errorf("%s: terminationGracePeriodSeconds %v must exceed preStop %v + --drain-timeout %v", where, grace, pre, drain)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: set cpu and memory requests and a memory limit", where)
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.FSGroup == nil {
		t.Errorf("%s: pod must run as non-root with an fsGroup (the PVC must be writable by uid 65532)", where)
	}

	// Services point at ports the pods have; the PDB allows one down.
	for _, svc := range m.services {
		if !matches(svc.Spec.Selector, s.Spec.Template.Labels) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := containerPort(c, p.TargetPort.String()); !ok {
				t.Errorf("Service %s port %s: targetPort %s is not a container port", svc.Name, p.Name, p.TargetPort.String())
			}
		}
	}
	pdb := find(m.pdbs, func(p *policyv1.PodDisruptionBudget) bool {
		return matches(p.Spec.Selector.MatchLabels, s.Spec.Template.Labels)
	})
	if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("no PodDisruptionBudget with maxUnavailable 1 selects the StatefulSet's pods")
	}
}

func find[T any](xs []*T, f func(*T) bool) *T {
	for _, x := range xs {
		if f(x) {
			return x
		}
	}
	return nil
}

func TestServiceMonitor(t *testing.T) {
	m := loadBase(t)
	if len(m.monitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(m.monitors))
	}
	u := m.monitors[0]
	// The fields of monitoring.coreos.com/v1 ServiceMonitor used here; an
	// unknown one is most likely a typo the operator would ignore.
	known := map[string][]string{
		"":                 {"apiVersion", "kind", "metadata", "spec"},
		"spec":             {"selector", "endpoints", "namespaceSelector", "jobLabel"},
		"spec.selector":    {"matchLabels"},
		"spec.endpoints[]": {"port", "path", "interval", "scrapeTimeout", "scheme"},
	}
	keysOf := func(path string, obj map[string]any) {
		for k := range obj {
			if !slices.Contains(known[path], k) {
				t.Errorf("ServiceMonitor: unknown field %s.%s", path, k)
			}
		}
	}
	keysOf("", u.Object)
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	keysOf("spec", spec)
	sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	selObj, _, _ := unstructured.NestedMap(u.Object, "spec", "selector")
	keysOf("spec.selector", selObj)
	eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
	var selected []*corev1.Service
	for _, svc := range m.services {
		if matches(sel, svc.Labels) {
			selected = append(selected, svc)
		}
	}
	if len(selected) != 1 {
		t.Fatalf("ServiceMonitor selects %d Services, want exactly 1 (two would scrape every pod twice)", len(selected))
	}
	if len(eps) == 0 {
		t.Fatal("ServiceMonitor has no endpoints")
	}
	n := startNode(t)
	for _, e := range eps {
		ep, _ := e.(map[string]any)
		keysOf("spec.endpoints[]", ep)
		port, _ := ep["port"].(string)
		path, _ := ep["path"].(string)
		if !slices.ContainsFunc(selected[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
			t.Errorf("ServiceMonitor endpoint port %q is not a port of Service %s", port, selected[0].Name)
		}
		if _, err := get(n.url + path); err != nil || path != "/metrics" {
			t.Errorf("ServiceMonitor endpoint path %q: %v", path, err)
		}
	}
}

// composeFile is the part of the Compose file this test reads.
type composeFile struct {
	Services map[string]struct {
		Command     []string          `json:"command"`
		Environment map[string]string `json:"environment"`
		Ports       []string          `json:"ports"`
		Volumes     []string          `json:"volumes"`
	} `json:"services"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("compose/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatalf("compose/docker-compose.yml: %v", err)
	}
	return cf
}

func TestCompose(t *testing.T) {
	cf := loadCompose(t)
	if len(cf.Services) == 0 {
		t.Fatal("no services in the Compose file")
	}
	members := 0
	for name, svc := range cf.Services {
		where := "compose service " + name
		if len(svc.Command) == 0 {
			continue // not ringlimit (an upstream)
		}
		c := corev1.Container{Name: name, Args: svc.Command}
		for k, v := range svc.Environment {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
		}
		slices.SortFunc(c.Env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
		flags, env := checkContainer(t, where, c)
		if svc.Command[0] != "serve" {
			continue
		}
		members++
		if env["RINGLIMIT_ID"] != name || env["RINGLIMIT_ADVERTISE_HOST"] != name {
			t.Errorf("%s: id %q, advertise-host %q: want both %q", where, env["RINGLIMIT_ID"], env["RINGLIMIT_ADVERTISE_HOST"], name)
		}
		http := strconv.Itoa(int(flagPort(t, where, flags, env, "http")))
		for _, p := range svc.Ports {
			if !strings.HasSuffix(p, ":"+http) {
				t.Errorf("%s: port %q does not publish the HTTP port %s", where, p, http)
			}
		}
		rulesOK := false
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == env["RINGLIMIT_RULES"] {
				data, err := os.ReadFile(filepath.Join("compose", parts[0]))
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if _, err := rules.Parse(data); err != nil {
					t.Errorf("%s: %s: rules.Parse: %v", where, parts[0], err)
				}
				rulesOK = true
			}
		}
		if !rulesOK {
			t.Errorf("%s: RINGLIMIT_RULES %q is not a mounted file", where, env["RINGLIMIT_RULES"])
		}
	}
	if members != 3 {
		t.Errorf("%d members (serve) in the Compose file, want 3", members)
	}
}

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/ringlimit.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/ringlimit.json: %v", err)
	}
	n := startNode(t)
	exported := map[string]bool{}
	for _, line := range strings.Split(n.metrics, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		exported[name] = true
	}
	nameRe := regexp.MustCompile(`\bringlimit_[a-z0-9_]+`)
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			names := nameRe.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no ringlimit metric", p.Title, tg.Expr)
			}
			for _, name := range names {
				if !exported[name] {
					t.Errorf("panel %q: %s is not exported by the binary's /metrics", p.Title, name)
				}
			}
		}
	}
	if queries < 10 {
		t.Errorf("only %d queries in the dashboard", queries)
	}
	t.Logf("%d dashboard queries over %d exported ringlimit series names", queries, len(exported))
}
