package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/router/rls"
)

// envoyFlags are the Envoy RLS flags of serve and router.
type envoyFlags struct {
	grpc, config *string
	headers      *bool
}

func addEnvoyFlags(fs *flag.FlagSet) envoyFlags {
	return envoyFlags{
		grpc:    fs.String("grpc", "", "listen address of the Envoy rate-limit (RLS v3) gRPC service; off when empty"),
		config:  fs.String("envoy-config", "", "envoyproxy/ratelimit-style YAML file or directory for --grpc, reloaded when it changes"),
		headers: fs.Bool("envoy-headers", false, "add x-ratelimit-* response headers to RLS answers for Envoy to send"),
	}
}

// check refuses a bad combination or a config that does not load, before
// anything starts.
func (f envoyFlags) check() error {
	if *f.config != "" && *f.grpc == "" {
		return errors.New("--envoy-config needs --grpc")
	}
	if *f.config != "" {
		if _, err := rls.LoadConfig(*f.config); err != nil {
			return fmt.Errorf("envoy config refused: %w", err)
		}
	}
	return nil
}

// listen opens the --grpc listener; nil when --grpc is empty.
func (f envoyFlags) listen() (net.Listener, error) {
	if *f.grpc == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", hostPort(*f.grpc))
	if err != nil {
		return nil, fmt.Errorf("--grpc: %w", err)
	}
	return ln, nil
}

func (f envoyFlags) options() rls.Options {
	return rls.Options{ConfigPath: *f.config, Headers: *f.headers}
}

// startEnvoy serves the RLS on ln for checker, its health service
// following ready (the process's /readyz); nil when ln is nil.
func startEnvoy(f envoyFlags, ln net.Listener, checker rls.Checker, ready func() error, reg prometheus.Registerer, log *slog.Logger) (*rls.Server, error) {
	if ln == nil {
		return nil, nil
	}
	o := f.options()
	o.Registerer, o.Logger, o.Ready = reg, log, ready
	s, err := rls.New(o, checker)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := s.Serve(ln); err != nil {
			log.Error("envoy rls stopped", "err", err)
		}
	}()
	return s, nil
}
