package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
)

// runLeave is `ringlimit leave`: drain a member and remove it from the
// cluster for good. --addr names any member; --id the one to remove, by
// default the member whose HTTP address is --addr. It exits 0, or 2 on
// error.
//
// --id is read from the command line only, never from RINGLIMIT_ID: a
// member's container or pod sets that to its own id (serve --id), so
// `leave` run there removed that member instead of the one at --addr.
// Without --id, a RINGLIMIT_ID that names another member than the one at
// --addr stops the leave before anything is removed (exit 2): whoever set
// it may have meant it, and a removal cannot be undone.
//
// A 503 (no leader: an election is under way, say) is asked again, with
// a growing pause, until --timeout. When a later answer is 404 (no such
// member), an earlier attempt removed it - its answer was lost - and the
// leave has succeeded.
func runLeave(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := newFlagSet("leave", stderr)
	addr := fs.String("addr", defaultAddr, "HTTP address of any member (host:port or URL)")
	id := fs.String("id", "", "id of the member to remove (default: the member at --addr); command line only, RINGLIMIT_ID is not read")
	token := fs.String("admin-token", "", "bearer token of the admin endpoints")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long (leaving drains the member first)")
	if code, ok := parseOrExit(fs, args, envExcept(getenv, "id")); !ok {
		return code
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()

	c := client.New(baseURL(*addr), client.WithAdminToken(*token))
	defer c.CloseIdleConnections()
	target := *id
	askers := []*client.Client{c}
	cl, err := c.Cluster(ctx)
	if target == "" {
		if err != nil {
			return fail(stderr, "leave", notAMember(*addr, err))
		}
		if target, err = memberAt(cl, hostPort(*addr)); err != nil {
			return fail(stderr, "leave", err)
		}
		if envID := getenv(envName("id")); envID != "" && envID != target {
			return fail(stderr, "leave", fmt.Errorf("the member at %s is %s, but %s=%s (a member's container sets it to its own id): leave does not read it; give --id %s to remove %s",
				hostPort(*addr), target, envName("id"), envID, target, target))
		}
	}
	// The member asked may stop under the leave: it is the one leaving,
	// or it is stopped meanwhile. If it goes before its answer reaches
	// us, the others say how the leave ended. With --id too (was: only
	// without --id, and `leave --addr <n3's> --id n3` exited 2 on a leave
	// that succeeded, asking the stopped member again). With --id the
	// cluster need not answer: the member at --addr is then the only one
	// asked, as before.
	leaving := false // the member asked is the one leaving
	if err == nil {
		at, _ := memberAt(cl, hostPort(*addr))
		leaving = at == target
		for _, m := range cl.Members {
			if m.ID != target && m.HTTP != "" && !isSelf(*addr, m.HTTP) {
				o := client.New(baseURL(m.HTTP), client.WithAdminToken(*token))
				defer o.CloseIdleConnections()
				askers = append(askers, o)
			}
		}
	}
	if err := leaveRetrying(ctx, askers, target, leaving, stderr); err != nil {
		return fail(stderr, "leave", fmt.Errorf("member %q: %w", target, err))
	}
	fmt.Fprintf(stdout, "member %s left the cluster\n", target)
	return exitOK
}

// leaveRetry is the first pause before asking again after a 503; each
// pause doubles, up to leaveRetryMax.
var leaveRetry, leaveRetryMax = 250 * time.Millisecond, 4 * time.Second

// leaveRetrying asks askers[0] for id's removal until it is done, the
// answer is an error other than 503, or ctx ends (see runLeave). Once
// askers[0] stops answering after a 503, the next of askers is asked
// instead; when askers[0] is the member leaving (leaving), at its first
// 503 already (its relay to the leader cut short as it stops, or no
// leader yet). A member asked that is not the one leaving is asked again
// after a 503 (an election), as before.
func leaveRetrying(ctx context.Context, askers []*client.Client, id string, leaving bool, stderr io.Writer) error {
	wait := leaveRetry
	var unavailable error // the last 503 or silence, once there was one
	for {
		err := askers[0].Leave(ctx, id)
		var ae *api.Error
		switch {
		case err == nil:
			return nil
		case unavailable != nil && errors.As(err, &ae) && ae.Code == api.CodeNotFound:
			return nil // an earlier attempt removed it; its answer was lost
		case unavailable != nil && ctx.Err() != nil:
			return fmt.Errorf("%w (gave up: %w)", unavailable, ctx.Err())
		case unavailable != nil && !errors.As(err, &ae) && len(askers) > 1:
			askers = askers[1:]
			fmt.Fprintf(stderr, "ringlimit leave: %v; asking another member\n", err)
			continue
		case !errors.As(err, &ae) || ae.Code != api.CodeUnavailable:
			return err
		case leaving && len(askers) > 1:
			// The member leaving answers 503 as it stops (or before a
			// leader has its leave): the others say how it ends. Said
			// as the progress it is, the 503 last: was "the member
			// leaving answered unavailable (503): leader unreachable:
			// …" first, which read as a failure of a leave that went
			// on to succeed.
			unavailable, askers, leaving = err, askers[1:], false
			fmt.Fprintf(stderr, "ringlimit leave: asking another member how the leave of %s ends (a member stops as it leaves; %s answered %v)\n", id, id, err)
			continue
		}
		unavailable = err
		fmt.Fprintf(stderr, "ringlimit leave: %v; asking again in %v\n", err, wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, leaveRetryMax)
	}
}

// memberAt returns the id of the one member whose HTTP address is addr,
// compared as serve compares its --join entries with its own address
// (isSelf: host names without case or a trailing dot, localhost for
// 127.0.0.1).
func memberAt(cl api.Cluster, addr string) (string, error) {
	var ids, all []string
	for _, m := range cl.Members {
		all = append(all, m.ID+"="+m.HTTP)
		if isSelf(addr, m.HTTP) {
			ids = append(ids, m.ID)
		}
	}
	switch len(ids) {
	case 1:
		return ids[0], nil
	case 0:
		if len(all) == 0 {
			return "", errors.New("the cluster has no members; give --id")
		}
		return "", fmt.Errorf("no member has HTTP address %s (members: %s); give --id", addr, strings.Join(all, ", "))
	default:
		return "", fmt.Errorf("members %s all have HTTP address %s; give --id", strings.Join(ids, ", "), addr)
	}
}
