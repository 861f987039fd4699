package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
)

// runStatus is `ringlimit status`: the membership as --addr sees it, as a
// table or (--json) as the /v1/cluster object. It exits 0; 1 when the
// cluster has no leader or, with --ready, the member is not ready; 2 on error,
// which includes a node that has no view of the cluster yet (not joined,
// or just started): it answers 503, or (an older version) lists no
// members, and status says so rather than print a cluster of nobody.
func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	addr := fs.String("addr", defaultAddr, "HTTP address of any member (host:port or URL)")
	asJSON := fs.Bool("json", false, "print the /v1/cluster object")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	ready := fs.Bool("ready", false, "exit 1 unless the member at --addr is ready too (its /readyz): a health check for an image with no curl")
	if code, ok := parseOrExit(fs, args, getenv); !ok {
		return code
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()

	c := client.New(baseURL(*addr))
	defer c.CloseIdleConnections()
	cl, err := c.Cluster(ctx)
	if err != nil {
		return fail(stderr, "status", notAMember(*addr, err))
	}
	if len(cl.Members) == 0 {
		return fail(stderr, "status", fmt.Errorf("%s has no view of the cluster yet (it lists no members): it has not joined a cluster, or has just started", hostPort(*addr)))
	}
	if *asJSON {
		err = writeJSON(stdout, cl)
	} else {
		err = writeStatus(stdout, cl)
	}
	if err != nil {
		return fail(stderr, "status", err)
	}
	if cl.Leader == "" {
		// Printed, but not a healthy answer: without a leader no member
		// renews its lease, so checks end degraded, and no membership
		// or rules change can be made. Was: exit 0, which a script or
		// a health check could not tell from a healthy cluster.
		fmt.Fprintln(stderr, "ringlimit status: no leader (an election, or too few voters reach each other): members may not answer, and no membership or rules change can be made")
		return exitNoLeader
	}
	if *ready {
		// The cluster has a leader, but this member may not serve yet
		// (just started, or marked down): what a container's health
		// check means by healthy (was: Compose's health check ran status
		// alone, healthy while the member's /readyz said 503).
		if err := c.Ready(ctx); err != nil {
			fmt.Fprintf(stderr, "ringlimit status: the member at %s is not ready: %v\n", hostPort(*addr), err)
			return exitNoLeader
		}
	}
	return exitOK
}

// writeStatus prints the cluster as a table:
//
//	leader         n1
//	epoch          42
//	partitions     1024
//	members        1
//	rules version  7
//
//	ID  STATE   HTTP            RAFT            PEER            PARTITIONS  VOTER
//	n1  active  127.0.0.1:8080  127.0.0.1:8081  127.0.0.1:8082  341         yes
//
// VOTER is last, so the columns before it stay where scripts find them;
// it is "-" when the member's node does not report it (an older version).
// Under the table, from the leader's answer, a line for each member it
// has not heard from for a second or more (writeSilences).
func writeStatus(w io.Writer, cl api.Cluster) error {
	leader := cl.Leader
	if leader == "" {
		leader = "(none)"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "leader\t%s\n", leader)
	fmt.Fprintf(tw, "epoch\t%d\n", cl.Epoch)
	fmt.Fprintf(tw, "partitions\t%d\n", cl.Partitions)
	fmt.Fprintf(tw, "members\t%d\n", len(cl.Members))
	fmt.Fprintf(tw, "rules version\t%d\n", cl.RulesVersion)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tHTTP\tRAFT\tPEER\tPARTITIONS\tVOTER")
	for _, m := range cl.Members {
		id := m.ID
		if m.ID == cl.Leader {
			id += " *"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", id, m.State, m.HTTP, m.Raft, m.Peer, m.Partitions, voterText(m.Voter))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeSilences(w, cl); err != nil {
		return err
	}
	if len(cl.RaftOnly) > 0 {
		_, err := fmt.Fprintf(w, "\nin Raft's configuration, no member: %s (a leave or a join under way)\n", strings.Join(cl.RaftOnly, ", "))
		return err
	}
	return nil
}

// silentNote is how long the leader must not have heard from a member
// before status says so: its failure detector pings every few hundred
// milliseconds, so a second is already unusual.
const silentNote = time.Second

// writeSilences prints, under the table, a line for each member the
// leader has not heard from for silentNote or more (silent_ms, which only
// the leader's answer carries): a crashed member still shows active,
// with its partitions, until it is marked dead.
func writeSilences(w io.Writer, cl api.Cluster) error {
	first := true
	for _, m := range cl.Members {
		if m.SilentMS == nil || time.Duration(*m.SilentMS)*time.Millisecond < silentNote {
			continue
		}
		if first {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
			first = false
		}
		silent := (time.Duration(*m.SilentMS) * time.Millisecond).Round(100 * time.Millisecond)
		if _, err := fmt.Fprintf(w, "%s: the leader has not heard from it for %v (a member silent for --dead-after is marked dead)\n", m.ID, silent); err != nil {
			return err
		}
	}
	return nil
}

// notAMember adds to err, when it is an answer that is not the API's
// JSON (code http_<status>: a 404 page, another kind of server), that
// --addr must be a member's HTTP address.
func notAMember(addr string, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && strings.HasPrefix(ae.Code, "http_") {
		return fmt.Errorf("%w: %s does not answer GET /v1/cluster as a ringlimit member does; --addr must be a member's HTTP address", err, hostPort(addr))
	}
	return err
}

// voterText is the VOTER column: yes, no, or - when not reported.
func voterText(v *bool) string {
	switch {
	case v == nil:
		return "-"
	case *v:
		return "yes"
	}
	return "no"
}
