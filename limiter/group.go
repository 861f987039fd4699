package limiter

import (
	"errors"
	"fmt"
	"slices"
)

// ErrGroup: a group that checks one bucket twice, or that has fewer
// decisions than items (CheckGroup).
var ErrGroup = errors.New("limiter: invalid group")

// Item is one check of a group (Table.CheckGroup): cost units on the
// bucket (a BucketHash) of partition Part under Rule, as in Table.Check.
type Item struct {
	Part   uint32
	Bucket uint64
	Rule   *Rule
	Cost   int64
}

// linearGroup is the largest group whose buckets are told apart by
// comparing every pair; a larger one uses a map.
const linearGroup = 16

// CheckGroup decides items all-or-nothing at one instant now, writing
// item i's decision to out[i] (len(out) ≥ len(items)), and reports
// whether the group passed.
//
// The group passes when every item's decision, alone, allows (for a cost
// of 0: a cost-1 check would pass). Then every item is spent exactly as
// Check would spend it, and out holds the decisions Check would give.
// Otherwise nothing is stored and every decision has Allowed false: an
// item that denied has its own decision (its RetryAfter > 0 says when
// it would pass), and an item that would have passed answers as a cost-0
// query (Remaining and ResetAfter as they are, RetryAfter and Delay 0).
//
// Every partition the items name is locked for the whole decision, in
// ascending order (so groups never deadlock with each other, or with
// SetRules, which locks all partitions in that order): no other check
// of those partitions comes between the decision and the spend.
//
// Items are validated as Check validates one (ErrPartition, ErrCost,
// ErrRule, ErrVersion, each wrapped with the item's index); two items on
// one bucket (same partition and slot key, see slotKey) are refused with
// an error wrapping ErrGroup; an item in a fenced partition (Fence) with
// ErrFenced itself. On any error nothing is spent and out is
// unspecified. An empty group passes.
func (t *Table) CheckGroup(items []Item, now int64, out []Decision) (bool, error) {
	if len(out) < len(items) {
		return false, fmt.Errorf("%w: %d decisions for %d items", ErrGroup, len(out), len(items))
	}
	for i := range items {
		it := &items[i]
		if err := t.checkItem(it.Part, it.Rule, it.Cost); err != nil {
			return false, fmt.Errorf("items[%d]: %w", i, err)
		}
	}
	if err := distinctBuckets(items); err != nil {
		return false, err
	}
	var buf [linearGroup]uint32
	parts := buf[:0]
	for i := range items {
		parts = append(parts, items[i].Part)
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	for _, p := range parts {
		t.parts[p].mu.Lock()
	}
	defer func() {
		for _, p := range parts {
			t.parts[p].mu.Unlock()
		}
	}()
	for _, p := range parts {
		if t.parts[p].fenced {
			return false, ErrFenced
		}
	}
	for _, p := range parts { // one instant for all: the latest clock
		now = max(now, t.parts[p].last)
	}
	for _, p := range parts {
		t.parts[p].last = now
	}
	g := t.sets.Load() // under the locks: see freeTag
	pass := true
	// resolve is the set and rule item it is decided with (see late).
	resolve := func(it *Item) (*ruleSet, *Rule) {
		set := g.lookup(it.Rule.Version)
		if set != nil && now >= g.life[set.tag].writable {
			return late(g, it.Rule)
		}
		return set, it.Rule
	}
	for i := range items {
		it := &items[i]
		set, r := resolve(it)
		if set == nil {
			return false, fmt.Errorf("items[%d]: %w", i, versionError(it.Rule))
		}
		t.parts[it.Part].decideLocked(g, set, it.Bucket, r, now, it.Cost, false, &out[i])
		pass = pass && out[i].Allowed
	}
	for i := range items {
		it := &items[i]
		p := &t.parts[it.Part]
		set, r := resolve(it)
		switch {
		case pass:
			p.decideLocked(g, set, it.Bucket, r, now, it.Cost, true, &out[i])
		case out[i].Allowed:
			if it.Cost > 0 { // what it would have spent is not spent
				p.decideLocked(g, set, it.Bucket, r, now, 0, false, &out[i])
			}
			out[i].Allowed, out[i].RetryAfter, out[i].Delay = false, 0, 0
		}
	}
	return pass, nil
}

// distinctBuckets refuses a group with two items on one bucket.
func distinctBuckets(items []Item) error {
	type id struct {
		part uint32
		key  uint64
	}
	dup := func(i, j int) error {
		return fmt.Errorf("%w: items[%d] and items[%d] check one bucket", ErrGroup, j, i)
	}
	if len(items) <= linearGroup {
		for i := range items {
			a := id{items[i].Part, slotKey(items[i].Bucket)}
			for j := range i {
				if a == (id{items[j].Part, slotKey(items[j].Bucket)}) {
					return dup(i, j)
				}
			}
		}
		return nil
	}
	seen := make(map[id]int, len(items))
	for i := range items {
		a := id{items[i].Part, slotKey(items[i].Bucket)}
		if j, ok := seen[a]; ok {
			return dup(i, j)
		}
		seen[a] = i
	}
	return nil
}
