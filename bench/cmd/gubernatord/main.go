// Command gubernatord is gubernator v2's daemon, built from its module at
// the version bench/go.mod pins, with a static peer list: the upstream
// binary discovers peers through memberlist, etcd, DNS or Kubernetes,
// none of which a reproducible benchmark on one machine wants.
//
// Configuration is upstream's (GUBER_* environment variables, read by
// gubernator.SetupDaemonConfig); peer discovery is forced to "none" and
// the peers are set once from --peers. SIGTERM or SIGINT closes the
// daemon.
//
//	GUBER_GRPC_ADDRESS=127.0.0.1:28101 GUBER_HTTP_ADDRESS=127.0.0.1:28111 \
//	  gubernatord --peers 127.0.0.1:28101,127.0.0.1:28102,127.0.0.1:28103
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gubernatord:", err)
		os.Exit(1)
	}
}

func run() error {
	peers := flag.String("peers", "", "comma-separated gRPC addresses of every instance, this one included (empty: alone)")
	flag.Parse()
	log := logrus.StandardLogger()
	log.SetLevel(logrus.WarnLevel)
	if err := os.Setenv("GUBER_PEER_DISCOVERY_TYPE", "none"); err != nil {
		return err
	}
	conf, err := gubernator.SetupDaemonConfig(log, nil)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := gubernator.SpawnDaemon(ctx, conf)
	if err != nil {
		return fmt.Errorf("spawning the daemon: %w", err)
	}
	defer d.Close()
	list := []gubernator.PeerInfo{{GRPCAddress: conf.AdvertiseAddress}}
	if *peers != "" {
		list = list[:0]
		for p := range strings.SplitSeq(*peers, ",") {
			list = append(list, gubernator.PeerInfo{GRPCAddress: strings.TrimSpace(p)})
		}
	}
	d.SetPeers(list)
	<-ctx.Done()
	return nil
}
