package rules

import (
	"strings"
	"testing"
)

// FuzzMatchPath holds matchPath to the segment-by-segment matching it
// replaced (refMatchPath, which found each path segment first and cost
// a path's length per route), on any pattern and path.
func FuzzMatchPath(f *testing.F) {
	for _, s := range [][2]string{
		{"/v1/chat/*", "/v1/chat/x/y"}, {"/login", "/login/"}, {"/x/*/", "/x/a/"}, {"/*", "/"},
		{"/a/*/c", "/a/b/c"}, {"/", "/"}, {"/a", "/ab"}, {"/a/*", "/a"}, {"/*/x", "//x"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, path string) {
		for _, loose := range []bool{false, true} {
			if got, want := matchPath(pattern, path, loose, false), refMatchPath(pattern, path, loose); got != want {
				t.Fatalf("matchPath(%q, %q, %v) = %v, the reference says %v", pattern, path, loose, got, want)
			}
			// Folded, it is the reference on both lower-cased (ASCII).
			if got, want := matchPath(pattern, path, loose, true), refMatchPath(lowerASCII(pattern), lowerASCII(path), loose); got != want {
				t.Fatalf("matchPath(%q, %q, %v, fold) = %v, the reference on both lower-cased says %v", pattern, path, loose, got, want)
			}
		}
	})
}

// matchPath is matchTrimmed on a path not yet trimmed.
func matchPath(pattern, path string, loose, fold bool) bool {
	if loose {
		path = trimSlashes(path)
	}
	return matchTrimmed(pattern, path, loose, fold)
}

// lowerASCII is s with its ASCII letters lower-cased.
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// refMatchPath is matchPath as it was before matchSegments compared
// lazily (the reference).
func refMatchPath(pattern, path string, loose bool) bool {
	prefix, ok := strings.CutSuffix(pattern, "/*")
	if loose {
		pattern, path = trimSlashes(pattern), trimSlashes(path)
	}
	switch {
	case !ok:
		return refMatchSegments(pattern, path)
	case prefix == "":
		return true
	}
	if cut := refNthSlash(path, strings.Count(prefix, "/")+1); cut >= 0 {
		path = path[:cut]
	}
	return refMatchSegments(prefix, path)
}

func refNthSlash(s string, n int) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			n--
			if n == 0 {
				return i
			}
		}
	}
	return -1
}

func refMatchSegments(pattern, path string) bool {
	for {
		pi := strings.IndexByte(pattern, '/')
		qi := strings.IndexByte(path, '/')
		if (pi < 0) != (qi < 0) {
			return false
		}
		if pi < 0 {
			return pattern == "*" || pattern == path
		}
		if p, q := pattern[:pi], path[:qi]; p != "*" && p != q {
			return false
		}
		pattern, path = pattern[pi+1:], path[qi+1:]
	}
}
