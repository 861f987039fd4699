package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// What the Docker scenarios (6 and 8) share: three members in containers
// of a FROM scratch image holding the static binary, on a private network
// with fixed addresses, so that a fault can name a member by its address.

// docker runs the docker CLI and returns its combined output.
func docker(args ...string) (string, error) {
	out, err := exec.Command("docker", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := docker(args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// needDocker skips the scenario when no Docker engine answers.
func needDocker(t *testing.T, scenario string) {
	t.Helper()
	if out, err := docker("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("%s needs a Docker engine, and none answers (`docker version`: %v %s)", scenario, err, out)
	}
}

// dockerCluster is three members n1, n2, n3 in containers named tag-<id>
// on the network tag, each serving HTTP on :8080, Raft on :8081 and the
// data plane on :8082 of its own address. The test's cleanup saves every
// member's log into the output directory and removes the containers, the
// network and the image.
type dockerCluster struct {
	*cluster
	tag string
	ips map[string]string // member id → its address on the network
}

// container returns the name of m's container.
func (d *dockerCluster) container(m *member) string { return d.tag + "-" + m.id }

// startDocker3 builds the image, creates the network and starts the three
// members (n2 and n3 join through n1), and waits until they have settled
// in one ring. tag names the image, the network and the containers: it
// must be unique to the process and the scenario.
func startDocker3(t *testing.T, tag string, dead time.Duration) *dockerCluster {
	t.Helper()
	dir := output(t)

	// Image FROM scratch with the static binary: nothing to pull.
	ctx := t.TempDir()
	bin, err := os.ReadFile(binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctx, "ringlimit"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctx, "Dockerfile"), []byte("FROM scratch\nCOPY ringlimit /ringlimit\nENTRYPOINT [\"/ringlimit\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	image := tag + ":latest"
	build := exec.Command("docker", "build", "-q", "-t", image, ctx)
	build.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = docker("rmi", "-f", image) })

	// A private network with a fixed subnet, so a member keeps its
	// address when it is reconnected.
	var subnet string
	for i := 0; i < 20 && subnet == ""; i++ {
		s := fmt.Sprintf("172.30.%d", (os.Getpid()+i*7)%250)
		if _, err := docker("network", "create", "--subnet", s+".0/24", tag); err == nil {
			subnet = s
		}
	}
	if subnet == "" {
		t.Fatal("docker network create: no free 172.30.x.0/24 subnet")
	}
	t.Cleanup(func() { _, _ = docker("network", "rm", tag) })

	// API.md: serve on a non-loopback address needs --insecure (or a
	// secret or TLS); a build that predates the flag does not know it.
	insecure := []string{}
	if help, _ := exec.Command(binary(t), "serve", "-h").CombinedOutput(); strings.Contains(string(help), "-insecure") {
		insecure = append(insecure, "--insecure")
	}
	d := &dockerCluster{cluster: &cluster{t: t, dir: dir, deadAfter: dead}, tag: tag, ips: map[string]string{}}
	for i, id := range []string{"n1", "n2", "n3"} {
		ip := fmt.Sprintf("%s.%d", subnet, 11+i)
		d.ips[id] = ip
		name := tag + "-" + id
		args := []string{"run", "-d", "--name", name, "--network", tag, "--ip", ip, image,
			"serve", "--id", id, "--http", "0.0.0.0:8080", "--raft", "0.0.0.0:8081", "--peer", "0.0.0.0:8082",
			"--advertise-host", ip, "--data-dir", "/data", "--dead-after", dead.String(), "--admin-token", adminToken}
		args = append(args, insecure...)
		if i > 0 {
			args = append(args, "--join", d.ips["n1"]+":8080")
		}
		mustDocker(t, args...)
		t.Cleanup(func() {
			if logs, err := docker("logs", name); err == nil {
				_ = os.WriteFile(filepath.Join(dir, id+".log"), []byte(logs), 0o644)
			}
			_, _ = docker("rm", "-f", name)
		})
		m := &member{id: id, http: ip + ":8080"}
		d.members = append(d.members, m)
		waitFor(t, id+" ready", 60*time.Second, func() bool { return status(m.http, "/readyz") == 200 })
	}
	d.waitSettled(d.members)
	return d
}
