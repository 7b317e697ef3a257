package request

import (
	"regexp"
	"strings"
)

// AssetHint returns a regexp that matches every path whose canonical form
// (CanonicalPath, folded when fold) may start with one of prefixes: a path
// CanonicalPath would clean (empty, relative, with "%", ";", "\", "//" or
// "/."), a path with a byte beyond ASCII (case folding is then Unicode's),
// and a path that starts with a prefix, case aside when fold. Any other path
// is its own canonical form, or that form's lower case, and so starts with
// no prefix. One compiled match answers for the common request, which is no
// asset, where canonicalising costs several calls under Yaegi (doc.go in the root).
func AssetHint(prefixes []string, fold bool) *regexp.Regexp {
	quoted := make([]string, len(prefixes))
	for i, prefix := range prefixes {
		quoted[i] = regexp.QuoteMeta(prefix)
	}

	group := "(?:"
	if fold {
		group = "(?i:"
	}

	// Anchored, with one alternative that scans the path once for the first
	// byte or pair CanonicalPath cleans: an unanchored alternation costs a
	// scan per alternative.
	return regexp.MustCompile(`^(?:$|[^/]|` + group + strings.Join(quoted, "|") + `)|[^%;\\\x80-\x{10FFFF}]*(?:[%;\\\x80-\x{10FFFF}]|//|/\.))`)
}
