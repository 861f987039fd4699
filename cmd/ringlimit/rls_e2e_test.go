package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/internal/logbuf"
)

// `serve --grpc --envoy-config` answers Envoy's ShouldRateLimit with the
// file's limits and picks up a change to the file.
func TestServeEnvoyRLS(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ratelimit.yaml")
	write := func(limit string) {
		cfg := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: " + limit + "\n"
		if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("2")
	grpcAddr := freePort(t)
	p := startServe(t, "e", filepath.Join(dir, "data"), "--grpc", grpcAddr, "--envoy-config", file)
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := rlspb.NewRateLimitServiceClient(cc)
	call := func(ip string) *rlspb.RateLimitResponse_DescriptorStatus {
		resp, err := c.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*commonpb.RateLimitDescriptor{{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0]
	}
	// /readyz can turn 200 a moment before the router's ring names this
	// member; until then checks are answered by failure mode (open: OK,
	// remaining 0, nothing spent). Probe until an owner decides.
	waitFor(t, "an owner deciding", func() bool { return call("probe").LimitRemaining == 1 })
	var codes []string
	for range 3 {
		codes = append(codes, call("10.0.0.1").Code.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
		t.Fatalf("three calls with a limit of 2: %s", got)
	}
	write("5")
	waitFor(t, "the changed envoy config in force", func() bool { return call("10.0.0.2").CurrentLimit.GetRequestsPerUnit() == 5 })
	if !strings.Contains(p.log.String(), "envoy config loaded") {
		t.Fatal("the reload was not logged")
	}
}

// `ringlimit router --grpc --envoy-config` answers ShouldRateLimit for a
// cluster it is not a member of, sharing the limit with the members' own
// --grpc: the rule travels with each check to its owner.
func TestRouterEnvoyRLS(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ratelimit.yaml")
	cfg := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_log}\n"
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	memberGRPC := freePort(t)
	m := startServe(t, "m1", filepath.Join(dir, "data"), "--grpc", memberGRPC, "--envoy-config", file)
	routerHTTP, routerGRPC := freePort(t), freePort(t)
	cmd := exec.Command(binary(t), "router", "--http", routerHTTP, "--cluster", m.http, "--grpc", routerGRPC, "--envoy-config", file)
	log := &logbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("router log:\n%s", lastLines(log.String(), 40))
		}
	})
	waitFor(t, "router ready", func() bool { return get(routerHTTP, "/readyz", nil) == 200 })
	call := func(addr, user string) *rlspb.RateLimitResponse {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		resp, err := rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*commonpb.RateLimitDescriptor{{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		if err != nil {
			t.Fatalf("call to %s: %v", addr, err)
		}
		return resp
	}
	// Until the ring names the member, checks are answered by failure
	// mode (OK, remaining 0, nothing spent): probe until an owner decides.
	waitFor(t, "an owner deciding", func() bool { return call(routerGRPC, "probe").Statuses[0].LimitRemaining == 3 })
	var codes []string
	for _, addr := range []string{routerGRPC, memberGRPC, routerGRPC, memberGRPC, routerGRPC, memberGRPC} {
		codes = append(codes, call(addr, "u1").OverallCode.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OK,OK,OVER_LIMIT,OVER_LIMIT" {
		t.Fatalf("router and member alternating on a limit of 4: %s", got)
	}
}
