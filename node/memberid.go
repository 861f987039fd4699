package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// memberIDFile, in a data dir, holds the id of the member whose Raft
// state the dir holds (the id and a newline), written at each start that
// opens the dir's Raft state under an id it accepts (openRaft).
//
// Why: serve's --id defaults to the hostname, which in a container is the
// container's id, new at every recreate, while the data dir is a volume
// that outlives it. A member recreated over its volume without --id (the
// image's own command) came back under a new id, and its start was
// refused: the dir held the Raft state of a cluster that never had a
// member of that id (an audit: the Compose stack's stand-in upstream
// crash-looped after `up --force-recreate`). serve now takes the id the
// dir records when --id is not given (RecordedID), and a dir with Raft
// state that records another id than the one given is refused (openRaft):
// a copied or mixed-up volume.
const memberIDFile = "member-id"

// RecordedID returns the member id recorded in data dir dir, or "" when
// it records none (a new dir, or one written before ids were recorded).
// A record that is not a valid id is an error wrapping ErrDataDir.
func RecordedID(dir string) (string, error) {
	path := filepath.Join(dir, memberIDFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("%w: reading the member id the dir records: %w", ErrDataDir, err)
	}
	id, ok := strings.CutSuffix(string(b), "\n")
	if !ok || !validID(id) {
		return "", fmt.Errorf("%w: %s: not a member id (1 to %d printable characters without spaces, then a newline): start the member with --id, the id of the member whose data dir it is (the file is then written again)", ErrDataDir, path, maxIDLen)
	}
	return id, nil
}

// recordID writes id to dir's memberIDFile, unless it holds it already.
func recordID(dir, id string) error {
	if got, err := RecordedID(dir); err == nil && got == id {
		return nil
	}
	if err := writeFileAtomic(dir, memberIDFile, []byte(id+"\n"), 0o600); err != nil {
		return fmt.Errorf("node: recording the member id in the data dir: %w", err)
	}
	return nil
}

// validID reports whether id may name a member: 1 to maxIDLen printable
// UTF-8 characters without spaces (validateJoin's rule).
func validID(id string) bool {
	return id != "" && len(id) <= maxIDLen && utf8.ValidString(id) &&
		strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0
}
