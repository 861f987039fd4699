package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// exactNames refuses, with a *bodyError, the first object key of the
// JSON value in that is one of names when case is ignored but not as
// written, or one of names given twice in one object; it returns nil
// when there is none (or in is not JSON: decoding it says why). The
// message names where the object is ("checks[3]: repeated field
// \"key\"").
//
// encoding/json matches field names case-insensitively and keeps the
// last of a repeated field, so {"Key": ...} was read as "key", and
// {"key": "a", "KEY": "b"} or {"key": "a", "key": "b"} as "b", where
// another reader of the body (a proxy, a log, the fast path) may see
// "a"; the contract names each field exactly and once. Names not in
// names are left to decoding (DisallowUnknownFields), so each object
// remembers at most len(names) names.
func exactNames(in []byte, names []string) error {
	dec := json.NewDecoder(bytes.NewReader(in))
	var stack []nameFrame
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if top.atKey {
				top.atKey = false
				k := tok.(string)
				top.key = k
				switch {
				case slices.Contains(top.seen, k):
					return &bodyError{where(stack) + fmt.Sprintf("repeated field %q: each field may be given once", k)}
				case slices.Contains(names, k):
					top.seen = append(top.seen, k)
				default:
					for _, want := range names {
						if strings.EqualFold(k, want) {
							return &bodyError{where(stack) + fmt.Sprintf("unknown field %q: field names are matched exactly (want %q)", k, want)}
						}
					}
				}
				continue
			}
			top.atKey = true // the value starts here
		} else if n > 0 {
			stack[n-1].index++
		}
		if d, ok := tok.(json.Delim); ok {
			f := nameFrame{object: d == '{', atKey: d == '{', index: -1}
			if len(stack) < cap(stack) {
				f.seen = stack[:len(stack)+1][len(stack)].seen[:0] // the array of the last object at this depth
			}
			stack = append(stack, f)
		}
	}
}

// nameFrame is an object or array exactNames is in.
type nameFrame struct {
	object, atKey bool
	key           string   // object: the field whose value is being read
	index         int      // array: the element being read
	seen          []string // object: the fields of names read so far
}

// where names the innermost object of stack for a message: "" at the
// top, "checks[3]: " in the fourth entry of a batch.
func where(stack []nameFrame) string {
	var b strings.Builder
	for _, f := range stack[:len(stack)-1] {
		switch {
		case !f.object:
			b.WriteString("[" + strconv.Itoa(f.index) + "]")
		case b.Len() > 0:
			b.WriteString("." + f.key)
		default:
			b.WriteString(f.key)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String() + ": "
}

// jsonNames returns the JSON field names of the struct v points to.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		if name != "-" {
			names = append(names, name)
		}
	}
	return names
}
