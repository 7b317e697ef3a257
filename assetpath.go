package tierlimit

import (
	"net/http"
	"regexp"
	"strings"
)

// assetHint returns a regexp that matches every path whose canonical form
// (canonicalPath, folded when fold) may start with one of prefixes: a path
// canonicalPath would clean (empty, relative, with "%", ";", "\", "//" or
// "/."), a path with a byte beyond ASCII (case folding is then Unicode's),
// and a path that starts with a prefix, case aside when fold. Any other path
// is its own canonical form, or that form's lower case, and so starts with
// no prefix. One compiled match answers for the common request, which is no
// asset, where canonicalising costs several calls under Yaegi (doc.go).
func assetHint(prefixes []string, fold bool) *regexp.Regexp {
	quoted := make([]string, len(prefixes))
	for i, prefix := range prefixes {
		quoted[i] = regexp.QuoteMeta(prefix)
	}

	group := "(?:"
	if fold {
		group = "(?i:"
	}

	// Anchored, with one alternative that scans the path once for the first
	// byte or pair canonicalPath cleans: an unanchored alternation costs a
	// scan per alternative.
	return regexp.MustCompile(`^(?:$|[^/]|` + group + strings.Join(quoted, "|") + `)|[^%;\\\x80-\x{10FFFF}]*(?:[%;\\\x80-\x{10FFFF}]|//|/\.))`)
}

// isAsset reports whether the request's canonical path starts with an asset
// prefix.
func isAsset(p *Plugin, req *http.Request) bool {
	return p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && hasAnyPrefix(canonicalPath(req.URL.Path, p.foldPaths), p.assetPaths)
}
