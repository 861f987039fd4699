package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// exactNames refuses, with a *bodyError, the first object key of the
// JSON value in that is one of names when case is ignored but not as
// written; it returns nil when there is none (or in is not JSON:
// decoding it says why). encoding/json matches field names
// case-insensitively, so {"Key": ...} was read as "key" and
// {"key": "a", "KEY": "b"} as "b" where every other reader of the body
// (a proxy, a log, the fast path) sees "a"; the contract names fields
// exactly.
func exactNames(in []byte, names []string) error {
	dec := json.NewDecoder(bytes.NewReader(in))
	type frame struct{ object, atKey bool }
	var stack []frame
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
				if k := tok.(string); !slices.Contains(names, k) {
					for _, want := range names {
						if strings.EqualFold(k, want) {
							return &bodyError{fmt.Sprintf("unknown field %q: field names are matched exactly (want %q)", k, want)}
						}
					}
				}
				continue
			}
			top.atKey = true // the value starts here
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, frame{object: d == '{', atKey: d == '{'})
		}
	}
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
