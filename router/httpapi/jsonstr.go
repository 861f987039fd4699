package httpapi

import "unicode/utf8"

// invalidJSONString says what makes the raw contents of a JSON string
// (the bytes between its quotes, syntax already checked by the decoder)
// not a faithful Unicode string, or "" when nothing does: raw bytes that
// are not UTF-8, or a \u escape of a surrogate that is not half of a
// pair. encoding/json silently turns both into U+FFFD.
func invalidJSONString(raw []byte) string {
	if !utf8.Valid(raw) {
		return "not valid UTF-8"
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue // a one-character escape (or a truncated one: the decoder refuses it)
		}
		r, ok := hex4(raw, i+1)
		if !ok {
			return "" // not ours to report: the decoder refuses it
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return `a \u escape of a lone low surrogate (not valid UTF-8)`
		case r >= 0xD800 && r <= 0xDBFF:
			if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if lo, ok := hex4(raw, i+3); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 6
					continue
				}
			}
			return `a \u escape of a lone high surrogate (not valid UTF-8)`
		}
	}
	return ""
}

// hex4 parses the four hex digits at raw[at:].
func hex4(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
