package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8slabels "k8s.io/apimachinery/pkg/labels"
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
	netpols  []*networkingv1.NetworkPolicy
	monitors []*unstructured.Unstructured
	alerts   []*prometheusRule
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
	// The Secret the operator makes (not in the base: its placeholders
	// would ship), as the example shows it.
	if data, err := os.ReadFile(filepath.Join(filepath.Dir(base), "secret.example.yaml")); err != nil {
		t.Fatal(err)
	} else {
		m.secrets = append(m.secrets, decode[corev1.Secret](t, "k8s/secret.example.yaml", data))
	}
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
		case "networking.k8s.io/v1 NetworkPolicy":
			m.netpols = append(m.netpols, decode[networkingv1.NetworkPolicy](t, path, data))
		case "monitoring.coreos.com/v1 ServiceMonitor":
			// A CRD: no Go type in k8s.io/api, so unstructured; its
			// fields are checked one by one in TestServiceMonitor.
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(data, &u.Object); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			m.monitors = append(m.monitors, u)
		case "monitoring.coreos.com/v1 PrometheusRule":
			m.alerts = append(m.alerts, decode[prometheusRule](t, path, data))
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
	for _, p := range memLimitProblems(c) {
		t.Errorf("%s: %s", where, p)
	}
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

// memLimitProblems says what is wrong with a container's GOMEMLIMIT: one
// from a resource field (limits.memory is the whole limit: the collector
// would work hard only at the OOM kill, and ringlimit's own soft limit at
// 90% of the cgroup's is off whenever GOMEMLIMIT is set), or a literal
// above 90% of its limits.memory.
func memLimitProblems(c corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		if e.ValueFrom != nil {
			out = append(out, "GOMEMLIMIT from valueFrom: a resource field is the whole memory limit (or a unitless number, read as bytes); "+
				"leave GOMEMLIMIT unset and ringlimit sets a soft limit at 90% of the container's limit")
			continue
		}
		soft, err := goMemLimit(e.Value)
		if err != nil {
			out = append(out, fmt.Sprintf("GOMEMLIMIT %q: %v", e.Value, err))
			continue
		}
		if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && float64(soft) > 0.9*float64(lim.Value()) {
			out = append(out, fmt.Sprintf("GOMEMLIMIT %q is over 90%% of limits.memory %s: no headroom before the OOM kill", e.Value, lim.String()))
		}
	}
	return out
}

func TestMemLimitProblems(t *testing.T) {
	limit := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
	for _, tc := range []struct {
		env  corev1.EnvVar
		want int
	}{
		{corev1.EnvVar{Name: "GOMEMLIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}}, 1},
		{corev1.EnvVar{Name: "GOMEMLIMIT", Value: "256MiB"}, 1},
		{corev1.EnvVar{Name: "GOMEMLIMIT", Value: "268435456"}, 1},
		{corev1.EnvVar{Name: "GOMEMLIMIT", Value: "256Mi"}, 1}, // not Go's syntax
		{corev1.EnvVar{Name: "GOMEMLIMIT", Value: "230MiB"}, 0},
		{corev1.EnvVar{Name: "GOGC", Value: "50"}, 0},
	} {
		c := corev1.Container{Env: []corev1.EnvVar{tc.env}, Resources: limit}
		if got := memLimitProblems(c); len(got) != tc.want {
			t.Errorf("env %s=%q (valueFrom %v) with limits.memory 256Mi: %q, want %d problems", tc.env.Name, tc.env.Value, tc.env.ValueFrom != nil, got, tc.want)
		}
	}
}

// goMemLimit parses a GOMEMLIMIT value as the Go runtime does: bytes,
// with an optional B, KiB, MiB, GiB or TiB suffix.
func goMemLimit(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a byte count with an optional B, KiB, MiB, GiB or TiB suffix")
	}
	return n * mult, nil
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
	flags, env := checkPod(t, m, "StatefulSet "+s.Name, pod, s.Spec.Template.Labels, n)
	// Identity and addresses: id = pod name; the advertised host is the
	// pod's headless-Service name; every pod is given the same --join
	// list, which names every pod and pod 0 first: pod 0 (and only pod 0)
	// is the seed, and a pod 0 over a lost PVC can ask the others.
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
		join := strings.Split(expand(env["RINGLIMIT_JOIN"], vars), ",")
		if self := join[0] == adv+":"+httpPort; self != (i == 0) {
			t.Errorf("%s: pod %d: --join %q vs own address %s:%s: seed = %v, want only pod 0", where, i, join, adv, httpPort, self)
		}
		if !slices.Contains(join, adv+":"+httpPort) {
			t.Errorf("%s: pod %d: --join %q does not list its own address %s:%s: pod 0 over a lost PVC would not ask it whether a cluster exists", where, i, join, adv, httpPort)
		}
	}

	// Data on the PVC; rules from the ConfigMap, valid.
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
	if data, ok := mountedFile(t, m, where, pod, env["RINGLIMIT_RULES"]); !ok {
		t.Errorf("%s: RINGLIMIT_RULES %q is not a key of a mounted ConfigMap", where, env["RINGLIMIT_RULES"])
	} else if _, err := rules.Parse([]byte(data)); err != nil {
		t.Errorf("%s: rules file %s: rules.Parse: %v", where, env["RINGLIMIT_RULES"], err)
	}

	if sc := pod.SecurityContext; sc == nil || sc.FSGroup == nil {
		t.Errorf("%s: set an fsGroup: the PVC must be writable by uid 65532", where)
	}

	// The PDB allows one member down.
	pdb := find(m.pdbs, func(p *policyv1.PodDisruptionBudget) bool {
		return matches(p.Spec.Selector.MatchLabels, s.Spec.Template.Labels)
	})
	if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("no PodDisruptionBudget with maxUnavailable 1 selects the StatefulSet's pods")
	}
}

// portFlags names, for each container port name, the listen flag whose
// port it must be.
var portFlags = map[string]string{"http": "http", "raft": "raft", "peer": "peer", "proxy": "listen", "admin": "admin"}

// healthPort is the container port serving /healthz and /readyz for each
// command (a gateway's own port would forward them to the upstream).
var healthPort = map[string]string{"serve": "http", "router": "http", "gateway": "admin"}

// checkPod holds the one container of a pod template to the binary and
// to the other manifests: command, env names, ports, probes, secrets,
// mounted ConfigMaps, the grace period, resources and the user.
func checkPod(t *testing.T, m *manifests, where string, pod corev1.PodSpec, labels map[string]string, n *testNode) (flags, env map[string]string) {
	t.Helper()
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(pod.Containers))
	}
	c := pod.Containers[0]
	where += " container " + c.Name
	flags, env = checkContainer(t, where, c)
	cmd := c.Args[0]

	// Ports: each named after its listen flag, equal to that flag's port.
	for _, p := range c.Ports {
		f, ok := portFlags[p.Name]
		if !ok {
			t.Errorf("%s: containerPort %q: unknown name (want one of %v)", where, p.Name, portFlags)
			continue
		}
		if _, ok := flags[f]; !ok {
			t.Errorf("%s: containerPort %q: ringlimit %s has no flag --%s", where, p.Name, cmd, f)
			continue
		}
		if want := flagPort(t, where, flags, env, f); p.ContainerPort != want {
			t.Errorf("%s: containerPort %q = %d, want %d (--%s)", where, p.Name, p.ContainerPort, want, f)
		}
	}
	// Probes, on the port serving them, paths that answer 200 on a ready
	// node. Members: readiness /readyz (a leader, its partitions),
	// liveness /healthz (never a leader). Routers and gateways: a startup
	// probe on /readyz (their first view), then readiness on /healthz: one
	// whose members are unreachable answers by the rules' failure modes,
	// which dropping out of its Service would turn into an outage of
	// whatever is behind it.
	probes := []struct {
		name, path string
		probe      *corev1.Probe
	}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}}
	if cmd != "serve" {
		probes = []struct {
			name, path string
			probe      *corev1.Probe
		}{{"startup", "/readyz", c.StartupProbe}, {"readiness", "/healthz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}}
	}
	for _, pr := range probes {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", where, pr.name)
			continue
		}
		if got := pr.probe.HTTPGet.Path; got != pr.path {
			t.Errorf("%s: %s probe on %s, want %s", where, pr.name, got, pr.path)
		}
		if got, want := pr.probe.HTTPGet.Port.String(), healthPort[cmd]; got != want {
			t.Errorf("%s: %s probe on port %s, want %q", where, pr.name, got, want)
		}
		if _, ok := containerPort(c, pr.probe.HTTPGet.Port.String()); !ok {
			t.Errorf("%s: %s probe port %s is not a container port", where, pr.name, pr.probe.HTTPGet.Port.String())
		}
		if _, err := get(n.url + pr.probe.HTTPGet.Path); err != nil {
			t.Errorf("%s: %s probe path: %v", where, pr.name, err)
		}
	}
	// Secrets and ConfigMaps referenced exist, with the keys used.
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
	// Once the binary has --cluster-secret, every process on the data
	// plane must have it (serve refuses non-loopback Raft without it):
	// a mounted Secret key of at least 32 bytes.
	if _, ok := flags["cluster-secret"]; ok {
		path, set := env["RINGLIMIT_CLUSTER_SECRET"]
		if !set {
			t.Errorf("%s: no RINGLIMIT_CLUSTER_SECRET, and ringlimit %s has --cluster-secret", where, cmd)
		} else if data, ok := mountedSecret(m, pod, path); !ok {
			t.Errorf("%s: RINGLIMIT_CLUSTER_SECRET %q is not a key of a mounted Secret", where, path)
		} else if len(strings.TrimRight(data, "\r\n")) < 32 {
			t.Errorf("%s: the cluster secret at %s has %d bytes, want at least 32", where, path, len(strings.TrimRight(data, "\r\n")))
		}
	}
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && find(m.cms, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name }) == nil {
			t.Errorf("%s: volume %s: no ConfigMap %s", where, v.Name, v.ConfigMap.Name)
		}
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		t.Errorf("%s: no preStop hook", where)
	}
	// Stopping: the preStop pause plus the drain (--drain-timeout: a
	// member's hand-off; a router's or a gateway's connections, then
	// requests in progress) fit in the grace period.
	drain := drainOf(t, where, flags, env)
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= preStop(c)+drain {
		t.Errorf("%s: terminationGracePeriodSeconds %v must exceed the preStop pause %v + --drain-timeout %v", where, g, preStop(c), drain)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: set cpu and memory requests and a memory limit", where)
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: the pod must run as non-root", where)
	}
	// Services that select these pods point at ports they have.
	for _, svc := range m.services {
		if !matches(svc.Spec.Selector, labels) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := containerPort(c, p.TargetPort.String()); !ok {
				t.Errorf("Service %s port %s: targetPort %s is not a container port of %s", svc.Name, p.Name, p.TargetPort.String(), where)
			}
		}
	}
	return flags, env
}

// drainOf is the --drain-timeout of a container whose command has one
// (RINGLIMIT_DRAIN_TIMEOUT, else the flag's default); 0 otherwise.
func drainOf(t *testing.T, where string, flags, env map[string]string) time.Duration {
	t.Helper()
	if _, ok := flags["drain-timeout"]; !ok {
		return 0
	}
	drain, err := time.ParseDuration(env["RINGLIMIT_DRAIN_TIMEOUT"])
	if err != nil {
		drain, err = time.ParseDuration(flags["drain-timeout"])
	}
	if err != nil {
		t.Errorf("%s: drain timeout: %v", where, err)
	}
	return drain
}

func preStop(c corev1.Container) time.Duration {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		return time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	return 0
}

// mountedFile returns the content of path when it is a key of a
// ConfigMap mounted in the pod's container.
func mountedFile(t *testing.T, m *manifests, where string, pod corev1.PodSpec, path string) (string, bool) {
	t.Helper()
	c := pod.Containers[0]
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm := find(m.cms, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name })
		for _, vm := range c.VolumeMounts {
			if vm.Name != v.Name || cm == nil {
				continue
			}
			for key, data := range cm.Data {
				if vm.MountPath+"/"+key == path {
					return data, true
				}
			}
		}
	}
	return "", false
}

// mountedSecret returns the content of path when it is a key of a Secret
// mounted in the pod's container.
func mountedSecret(m *manifests, pod corev1.PodSpec, path string) (string, bool) {
	c := pod.Containers[0]
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		sec := find(m.secrets, func(s *corev1.Secret) bool { return s.Name == v.Secret.SecretName })
		for _, vm := range c.VolumeMounts {
			if vm.Name != v.Name || sec == nil {
				continue
			}
			for key, data := range sec.StringData {
				file := key
				for _, it := range v.Secret.Items {
					if it.Key == key {
						file = it.Path
					}
				}
				if vm.MountPath+"/"+file == path {
					return data, true
				}
			}
		}
	}
	return "", false
}

// TestDeployments holds the routers and gateways to the binary.
func TestDeployments(t *testing.T) {
	m := loadBase(t)
	if len(m.deploys) == 0 {
		t.Skip("no Deployments (routers, gateways) in the base")
	}
	n := startNode(t)
	for _, d := range m.deploys {
		where := "Deployment " + d.Name
		if !matches(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("%s: selector %v does not select its pods %v", where, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		}
		_, env := checkPod(t, m, where, d.Spec.Template.Spec, d.Spec.Template.Labels, n)
		if cl, ok := env["RINGLIMIT_CLUSTER"]; ok {
			for _, a := range strings.Split(cl, ",") {
				host := strings.Split(strings.TrimSpace(a), ":")[0]
				if find(m.services, func(s *corev1.Service) bool { return s.Name == host }) == nil && !strings.Contains(host, ".") {
					t.Errorf("%s: RINGLIMIT_CLUSTER %q: %s is no Service of the base", where, cl, host)
				}
			}
		}
		if path, ok := env["RINGLIMIT_CONFIG"]; ok {
			data, ok := mountedFile(t, m, where, d.Spec.Template.Spec, path)
			if !ok {
				t.Errorf("%s: RINGLIMIT_CONFIG %q is not a key of a mounted ConfigMap", where, path)
			} else if err := checkGatewayConfig([]byte(data), []byte(clusterRules(t, m))); err != nil {
				t.Errorf("%s: %s: %v", where, path, err)
			}
		}
	}
}

// clusterRules is the rules file the StatefulSet's members apply.
func clusterRules(t *testing.T, m *manifests) string {
	t.Helper()
	for _, s := range m.sts {
		c := s.Spec.Template.Spec.Containers[0]
		for _, e := range c.Env {
			if e.Name == "RINGLIMIT_RULES" {
				if data, ok := mountedFile(t, m, "StatefulSet "+s.Name, s.Spec.Template.Spec, e.Value); ok {
					return data
				}
			}
		}
	}
	t.Fatal("no StatefulSet mounts the rules file it names in RINGLIMIT_RULES")
	return ""
}

func find[T any](xs []*T, f func(*T) bool) *T {
	for _, x := range xs {
		if f(x) {
			return x
		}
	}
	return nil
}

func TestServiceMonitors(t *testing.T) {
	m := loadBase(t)
	if len(m.monitors) == 0 {
		t.Fatal("no ServiceMonitor")
	}
	n := startNode(t)
	// The fields of monitoring.coreos.com/v1 ServiceMonitor used here; an
	// unknown one is most likely a typo the operator would ignore.
	known := map[string][]string{
		"":                 {"apiVersion", "kind", "metadata", "spec"},
		"spec":             {"selector", "endpoints", "namespaceSelector", "jobLabel"},
		"spec.selector":    {"matchLabels"},
		"spec.endpoints[]": {"port", "path", "interval", "scrapeTimeout", "scheme"},
	}
	scraped := map[string]string{} // pod labels (as a string) → monitor
	for _, u := range m.monitors {
		where := "ServiceMonitor " + u.GetName()
		keysOf := func(path string, obj map[string]any) {
			for k := range obj {
				if !slices.Contains(known[path], k) {
					t.Errorf("%s: unknown field %s.%s", where, path, k)
				}
			}
		}
		keysOf("", u.Object)
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		keysOf("spec", spec)
		selObj, _, _ := unstructured.NestedMap(u.Object, "spec", "selector")
		keysOf("spec.selector", selObj)
		sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
		if len(eps) == 0 {
			t.Errorf("%s: no endpoints", where)
		}
		var selected []*corev1.Service
		for _, svc := range m.services {
			if matches(sel, svc.Labels) {
				selected = append(selected, svc)
			}
		}
		if len(selected) == 0 {
			t.Errorf("%s selects no Service", where)
		}
		for _, svc := range selected {
			// Two Services in front of the same pods would scrape each
			// pod twice (the client and the headless Service, say).
			pods := fmt.Sprint(svc.Spec.Selector)
			if other, dup := scraped[pods]; dup {
				t.Errorf("%s: Service %s selects pods %s already scraped through %s", where, svc.Name, pods, other)
			}
			scraped[pods] = where + " via " + svc.Name
			for _, e := range eps {
				ep, _ := e.(map[string]any)
				keysOf("spec.endpoints[]", ep)
				port, _ := ep["port"].(string)
				path, _ := ep["path"].(string)
				if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
					t.Errorf("%s: endpoint port %q is not a port of Service %s", where, port, svc.Name)
				}
				if path != "/metrics" {
					t.Errorf("%s: endpoint path %q, want /metrics", where, path)
				} else if _, err := get(n.url + path); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
		}
	}
}

// composeFile is the part of the Compose file this test reads.
type composeFile struct {
	Services map[string]struct {
		Command     []string          `json:"command"`
		Environment map[string]string `json:"environment"`
		Ports       []string          `json:"ports"`
		Image       string            `json:"image"`
		Volumes     []string          `json:"volumes"`
		Tmpfs       []string          `json:"tmpfs"`
		Secrets     []string          `json:"secrets"`
		StopGrace   string            `json:"stop_grace_period"`
	} `json:"services"`
	Secrets map[string]struct {
		File string `json:"file"`
	} `json:"secrets"`
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
	joins := map[string]string{} // member → RINGLIMIT_JOIN
	var selves []string          // every member's own HTTP address
	for name, svc := range cf.Services {
		where := "compose service " + name
		if strings.Contains(svc.Image, "RINGLIMIT_IMAGE") {
			// The image's VOLUME /data: a named volume (a member's state,
			// kept over a recreate) or a tmpfs; left to Docker it is an
			// anonymous volume that each `down` leaves behind, and that a
			// recreate carries over to a container of a new host name.
			named := slices.ContainsFunc(svc.Volumes, func(v string) bool {
				parts := strings.Split(v, ":")
				return len(parts) >= 2 && parts[1] == "/data" && !strings.HasPrefix(parts[0], ".") && !strings.HasPrefix(parts[0], "/")
			})
			tmpfs := slices.ContainsFunc(svc.Tmpfs, func(m string) bool {
				path, opts, _ := strings.Cut(m, ":")
				return path == "/data" && strings.Contains(opts, "uid=65532") // writable by the image's user
			})
			if !named && !tmpfs {
				t.Errorf("%s: /data is neither a named volume nor a tmpfs of the image's user (uid 65532)", where)
			}
		}
		if len(svc.Command) == 0 {
			continue // the image's own command (the stand-in upstream)
		}
		c := corev1.Container{Name: name, Args: svc.Command}
		for k, v := range svc.Environment {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
		}
		slices.SortFunc(c.Env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
		flags, env := checkContainer(t, where, c)
		// Docker sends SIGKILL after stop_grace_period (10s by default):
		// the drain must fit in it.
		grace := 10 * time.Second
		if svc.StopGrace != "" {
			var err error
			if grace, err = time.ParseDuration(svc.StopGrace); err != nil {
				t.Errorf("%s: stop_grace_period: %v", where, err)
			}
		}
		if drain := drainOf(t, where, flags, env); grace <= drain {
			t.Errorf("%s: stop_grace_period %v must exceed --drain-timeout %v", where, grace, drain)
		}
		if _, ok := flags["cluster-secret"]; ok {
			path := env["RINGLIMIT_CLUSTER_SECRET"]
			name, isSecret := strings.CutPrefix(path, "/run/secrets/")
			if !isSecret || !slices.Contains(svc.Secrets, name) || cf.Secrets[name].File == "" {
				t.Errorf("%s: RINGLIMIT_CLUSTER_SECRET %q is not a Compose secret of the service", where, path)
			} else if data, err := os.ReadFile(filepath.Join("compose", cf.Secrets[name].File)); err != nil {
				t.Errorf("%s: %v", where, err)
			} else if n := len(strings.TrimRight(string(data), "\r\n")); n < 32 {
				t.Errorf("%s: the cluster secret has %d bytes, want at least 32", where, n)
			}
		}
		if svc.Command[0] != "serve" {
			continue
		}
		members++
		if env["RINGLIMIT_ID"] != name || env["RINGLIMIT_ADVERTISE_HOST"] != name {
			t.Errorf("%s: id %q, advertise-host %q: want both %q", where, env["RINGLIMIT_ID"], env["RINGLIMIT_ADVERTISE_HOST"], name)
		}
		http := strconv.Itoa(int(flagPort(t, where, flags, env, "http")))
		joins[name] = env["RINGLIMIT_JOIN"]
		selves = append(selves, name+":"+http)
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
	// One --join list for all, naming every member: its first is the one
	// seed, which over a lost volume asks the others before bootstrapping.
	slices.Sort(selves)
	first := strings.Split(joins["n1"], ",")[0]
	for name, join := range joins {
		list := strings.Split(join, ",")
		if sorted := slices.Sorted(slices.Values(list)); !slices.Equal(sorted, selves) || list[0] != first {
			t.Errorf("compose service %s: RINGLIMIT_JOIN %q: want every member's address %v, the same one first for all", name, join, selves)
		}
	}
	for name, svc := range cf.Services {
		if len(svc.Command) == 0 || svc.Command[0] != "gateway" {
			continue
		}
		config := mountedHostFile(t, svc.Volumes, svc.Environment["RINGLIMIT_CONFIG"])
		if err := checkGatewayConfig(config, mountedHostFile(t, cf.Services["n1"].Volumes, cf.Services["n1"].Environment["RINGLIMIT_RULES"])); err != nil {
			t.Errorf("compose service %s: %s: %v", name, svc.Environment["RINGLIMIT_CONFIG"], err)
		}
	}
}

// mountedHostFile reads the host file a Compose bind mount puts at path.
func mountedHostFile(t *testing.T, volumes []string, path string) []byte {
	t.Helper()
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == path {
			data, err := os.ReadFile(filepath.Join("compose", parts[0]))
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
	t.Fatalf("no Compose volume mounts %q", path)
	return nil
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
	pages := append([]string{n.metrics}, scrapeFollowers(t, n)...)
	for _, line := range strings.Split(strings.Join(pages, "\n"), "\n") {
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
	t.Logf("%d dashboard queries over %d series names exported by a member, a router and a gateway", queries, len(exported))
}

// TestKustomizeBuild renders the base with kubectl's kustomize, where
// kubectl is installed, and checks that every resource comes out once,
// with the image set by the kustomization.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: the base is not rendered (the other tests read its files directly)")
	}
	out, err := exec.Command(kubectl, "kustomize", base).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", base, err, out)
	}
	var k kustomization
	readStrict(t, filepath.Join(base, "kustomization.yaml"), &k)
	docs := strings.Split(string(out), "\n---\n")
	if len(docs) != len(k.Resources) {
		t.Errorf("kustomize rendered %d objects, want %d (one per resource file)", len(docs), len(k.Resources))
	}
	for _, d := range docs {
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct {
				Template struct {
					Spec corev1.PodSpec
				}
			}
		}
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, d)
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			if c.Image != "ringlimit:dev" {
				t.Errorf("rendered %s %s: image %q, want ringlimit:dev", obj.Kind, obj.Metadata.Name, c.Image)
			}
		}
	}
}

// The members' NetworkPolicy lets every pod reach the HTTP API, members
// alone reach Raft, and members, routers and gateways (whose pods its
// selectors must match, by their own labels) the data plane; the ports it
// names are the member container's.
func TestMemberNetworkPolicy(t *testing.T) {
	m := loadBase(t)
	if len(m.netpols) != 1 || len(m.sts) != 1 {
		t.Fatalf("%d NetworkPolicies and %d StatefulSets, want one each", len(m.netpols), len(m.sts))
	}
	np, sts := m.netpols[0], m.sts[0]
	podLabels := func(name string) map[string]string {
		if name == "member" {
			return sts.Spec.Template.Labels
		}
		d := find(m.deploys, func(d *appsv1.Deployment) bool { return d.Spec.Template.Labels["app.kubernetes.io/component"] == name })
		if d == nil {
			t.Fatalf("no Deployment of component %s", name)
		}
		return d.Spec.Template.Labels
	}
	selects := func(sel *metav1.LabelSelector, labels map[string]string) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("%s: selector %v: %v", np.Name, sel, err)
		}
		return s.Matches(k8slabels.Set(labels))
	}
	if !selects(&np.Spec.PodSelector, podLabels("member")) || selects(&np.Spec.PodSelector, podLabels("router")) {
		t.Fatalf("%s selects %v: want the members' pods alone", np.Name, np.Spec.PodSelector)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("%s: policyTypes %v, want [Ingress]", np.Name, np.Spec.PolicyTypes)
	}
	ports := map[string]bool{}
	for _, p := range sts.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	// reaches: which of the member's named ports pods labelled like from
	// (nil: a pod of no component, a client) may reach.
	reaches := func(from map[string]string) []string {
		var out []string
		for _, r := range np.Spec.Ingress {
			admitted := len(r.From) == 0
			for _, peer := range r.From {
				if peer.PodSelector != nil && peer.NamespaceSelector == nil && peer.IPBlock == nil && selects(peer.PodSelector, from) {
					admitted = true
				}
			}
			for _, p := range r.Ports {
				if p.Port == nil || p.Port.StrVal == "" || !ports[p.Port.StrVal] {
					t.Fatalf("%s: port %v is not a named port of the member container", np.Name, p.Port)
				}
				if admitted && !slices.Contains(out, p.Port.StrVal) {
					out = append(out, p.Port.StrVal)
				}
			}
			if len(r.Ports) == 0 && admitted {
				t.Fatalf("%s: a rule without ports opens every port", np.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	for from, want := range map[string][]string{
		"member":  {"http", "peer", "raft"},
		"router":  {"http", "peer"},
		"gateway": {"http", "peer"},
		"client":  {"http"},
	} {
		labels := map[string]string{"app": "someone-else"}
		if from != "client" {
			labels = podLabels(from)
		}
		if got := reaches(labels); !slices.Equal(got, want) {
			t.Errorf("%s pods reach the members' ports %v, want %v", from, got, want)
		}
	}
}
