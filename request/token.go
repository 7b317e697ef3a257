package request

import "strings"

// ValidToken reports whether s is an RFC 9110 token, as header names,
// methods and cookie names are: what the configuration and costFrom
// (../usage) accept where they name one.
func ValidToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}

	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}

	return true
}
