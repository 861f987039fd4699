package ring

// Move is a change of owner of one partition between two rings.
type Move struct {
	Partition uint32
	From, To  string // member IDs; From == "" when there was no owner, To == "" when there is none
}

// Diff returns the partitions whose owner ID differs between prev and next,
// sorted by partition. Owners are compared by ID only: a member whose
// addresses changed has not lost its partitions.
//
// prev may be nil (every owned partition of next is a move with From == "");
// so may next (every owned partition of prev is a move with To == ""). If the
// two rings have different partition counts, partition numbers do not name
// the same keys, so no state can be handed over: prev is treated as nil.
func Diff(prev, next *Ring) []Move {
	if prev != nil && next != nil && prev.cfg.Partitions != next.cfg.Partitions {
		prev = nil
	}
	n := 0
	switch {
	case next != nil:
		n = next.cfg.Partitions
	case prev != nil:
		n = prev.cfg.Partitions
	}
	var moves []Move
	for p := range n {
		from, to := ownerID(prev, p), ownerID(next, p)
		if from != to {
			moves = append(moves, Move{Partition: uint32(p), From: from, To: to})
		}
	}
	return moves
}

// ownerID returns the ID of the owner of p in r, "" if none (or r is nil).
func ownerID(r *Ring, p int) string {
	if r == nil {
		return ""
	}
	if i := r.owner[p]; i >= 0 {
		return r.members[i].ID
	}
	return ""
}
