package ring

import (
	"errors"
	"fmt"
	"math"
)

// Limits enforced by [Config.Validate].
const (
	// MaxPartitions bounds Config.Partitions.
	MaxPartitions = 1 << 20
	// MinReplicationFactor is the smallest usable Config.ReplicationFactor.
	// consistent walks at most (vnodes-1) ring positions when it looks for a
	// member with room, so with a single virtual node per member the one
	// member it skips may be the only one with room, and consistent panics
	// (a one-member ring with ReplicationFactor 1 always panics).
	MinReplicationFactor = 2
	// MaxReplicationFactor bounds Config.ReplicationFactor; a ring holds
	// members × ReplicationFactor virtual nodes.
	MaxReplicationFactor = 4096
)

// Sentinel errors. Errors returned by this package wrap one of them; test
// with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range (see *ConfigError).
	ErrInvalidConfig = errors.New("ring: invalid config")
	// ErrEmptyMemberID: a member has an empty ID.
	ErrEmptyMemberID = errors.New("ring: empty member id")
	// ErrDuplicateMember: two members share an ID.
	ErrDuplicateMember = errors.New("ring: duplicate member id")
	// ErrTooManyMembers: more members than partitions. consistent's per-member
	// capacity is ceil(floor(Partitions/members) × Load), which is 0 when
	// members > Partitions, and it panics.
	ErrTooManyMembers = errors.New("ring: more members than partitions")
	// ErrPlacement: consistent panicked while placing partitions. Validate
	// and New's checks are meant to make this unreachable; it exists so that
	// a bug there is an error, not a crashed node.
	ErrPlacement = errors.New("ring: partition placement failed")
)

// ConfigError reports one invalid Config field. It wraps ErrInvalidConfig.
type ConfigError struct {
	Field  string // Config field name, e.g. "Partitions"
	Value  any    // the rejected value
	Reason string // what a valid value looks like
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("ring: invalid config: %s = %v: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Config is the placement configuration. Every node of a cluster must use the
// same Config (it belongs in the replicated cluster config), or nodes will
// disagree about owners.
type Config struct {
	// Partitions is the fixed partition count: partition = keyHash % Partitions.
	// Changing it remaps every key. Default 1024; range [1, MaxPartitions].
	Partitions int
	// ReplicationFactor is the number of virtual nodes per member on the
	// consistent hash circle. More virtual nodes mean fewer partitions
	// moving between surviving members on a membership change (the
	// bounded-load pass spills less). Default 128; range
	// [MinReplicationFactor, MaxReplicationFactor].
	ReplicationFactor int
	// Load is the bounded-load factor: no member owns more than
	// ceil(floor(Partitions/members) × Load) partitions. Must be finite and
	// > 1 (with Load == 1 consistent runs out of room and panics whenever
	// members does not divide Partitions). Default 1.25.
	Load float64
}

// DefaultConfig returns the defaults: 1024 partitions, 128 virtual nodes per
// member, load factor 1.25.
func DefaultConfig() Config {
	return Config{Partitions: 1024, ReplicationFactor: 128, Load: 1.25}
}

// Validate reports every invalid field (joined; each is a *ConfigError
// wrapping ErrInvalidConfig). It does not modify c. Note that consistent
// silently replaces zero fields with its own defaults; Validate rejects them
// instead.
func (c Config) Validate() error {
	var errs []error
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		errs = append(errs, &ConfigError{"Partitions", c.Partitions,
			fmt.Sprintf("must be in [1, %d]", MaxPartitions)})
	}
	if c.ReplicationFactor < MinReplicationFactor || c.ReplicationFactor > MaxReplicationFactor {
		errs = append(errs, &ConfigError{"ReplicationFactor", c.ReplicationFactor,
			fmt.Sprintf("must be in [%d, %d]", MinReplicationFactor, MaxReplicationFactor)})
	}
	// Written as !(x > 1) so that NaN is rejected too.
	if !(c.Load > 1) || math.IsInf(c.Load, 0) {
		errs = append(errs, &ConfigError{"Load", c.Load, "must be finite and > 1"})
	}
	return errors.Join(errs...)
}
