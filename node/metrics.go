package node

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the member's counters, created even when unregistered.
type nodeMetrics struct {
	handoffParts prometheus.Counter
	backupErrors prometheus.Counter
	backupLag    prometheus.Gauge
	markedDead   prometheus.Counter
	// The rules file's (WatchRulesFile; registered only with one).
	rulesFileLoads *prometheus.CounterVec // result: ok, error
	rulesFileOK    prometheus.Gauge
}

func newNodeMetrics() *nodeMetrics {
	return &nodeMetrics{
		handoffParts: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_handoff_partitions_total", Help: "Partitions this member handed to their new owners."}),
		backupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_backup_errors_total", Help: "Backup pushes that failed (retried at the next round)."}),
		backupLag:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_backup_lag_seconds", Help: "Replication lag of the last backup round: the interval plus the time to push."}),
		markedDead:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_members_marked_dead_total", Help: "Members this node marked dead while leading."}),
		rulesFileLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_rules_file_loads_total",
			Help: "Loads of the rules file (--rules): the first at start, then each change; by result (ok; error: unreadable or invalid, the rules in force stay)."}, []string{"result"}),
		rulesFileOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_rules_file_last_load_ok",
			Help: "1 when the last load of the rules file (--rules) succeeded, 0 when it was refused."}),
	}
}

// ofOwner is a metric's value read from the member's owner: f of it, 0
// before it has one.
func (n *Node) ofOwner(f func(*Owner) float64) func() float64 {
	return func() float64 {
		if o := n.owner.Load(); o != nil {
			return f(o)
		}
		return 0
	}
}

func (n *Node) registerMetrics() error {
	reg := n.cfg.Registerer
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_active_keys", Help: "Bucket states held by this node (idle keys are dropped)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Table().Len()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_raft_state", Help: "Raft state: 0 follower, 1 candidate, 2 leader, 3 shutdown."},
			func() float64 { return float64(n.raft.raft.State()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_ring_epoch", Help: "Epoch (raft index) of the ring in use."},
			func() float64 {
				if v := n.View(); v != nil {
					return float64(v.Ring.Epoch())
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_owned_partitions", Help: "Partitions this node owns."},
			func() float64 {
				if v := n.View(); v != nil {
					return float64(len(v.Ring.PartitionsOf(n.cfg.ID)))
				}
				return 0
			}),
	}
	cs = append(cs, n.stateCollectors()...)
	cs = append(cs, n.m.handoffParts, n.m.backupErrors, n.m.backupLag, n.m.markedDead,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_handoff_pending_partitions", Help: "Partitions this member still has to hand to their new owners."},
			func() float64 { return float64(n.h.Pending()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_awaiting_partitions", Help: "Partitions this member owns whose state has not arrived yet."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Awaiting()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_handoff_received_partitions_total", Help: "Partitions this member took over by hand-off from their previous owner (counted where they arrive: the sender of a stop counts its own as it exits)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.HandoffsReceived()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_partitions_served_from_nothing_total", Help: "Partitions this member began to serve, their hand-off wait over, with no backup copy to serve them from: their keys' budgets started full (an owner and its backup lost together, a hand-off lost with no copy, or a lone member's bucket file that could not be loaded)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.ServedFromNothing()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_owner_checks_total", Help: "Checks this member decided as their key's owner, whatever front door they came through (its own HTTP API or RLS, another member or router, a Go client on the data plane)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.Decided()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringlimit_key_cap_refused_total", Help: "Checks of new keys refused because this member tracks --max-keys states (answered by the rule's failure mode)."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.OverCapacity()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringlimit_backup_keys", Help: "Bucket states this member holds as a backup of other owners."},
			n.ofOwner(func(o *Owner) float64 { return float64(o.BackupTable().Len()) })))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("node: metrics: %w", err)
		}
	}
	return nil
}
