package request

import (
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Route paths and asset prefixes are compared with one canonical form of the
// request path, so that a spelling a backend treats as a limited path is
// counted as that path: backends decode percent-escapes (nginx before it
// resolves ".."), drop ";" parameters (servlet containers, so "..;" is ".."),
// treat "\" as "/" (IIS), ignore a trailing slash (Spring) and ignore case
// (Express, ASP.NET). A look-alike counted by mistake costs a client one
// request of its budget; a limited path counted as something else lets its
// budget be bypassed.

// maxDecodes bounds the rounds of percent-decoding after Go's own: enough for
// a path encoded three times over, and a fixed cost for anything longer.
const maxDecodes = 3

// CanonicalPath returns the canonical form of the decoded URL path p, in
// lower case when fold is set. Paths that hold nothing to canonicalise, the
// usual case, come back unchanged from one compiled regexp search: under
// Yaegi each compiled call allocates, and the rare work lives in
// canonicalForm and cleanPath, whose frames only those requests pay for.
func CanonicalPath(p string, fold bool) string {
	clean := canonical
	if fold {
		clean = canonicalLower
	}

	if p != "" && p[0] == '/' && !clean.MatchString(p) {
		return p
	}

	return canonicalForm(p, fold)
}

// canonicalForm is CanonicalPath of a path that may change.
func canonicalForm(p string, fold bool) string {
	if p == "" || p[0] != '/' || strings.ContainsAny(p, `%;\`) || strings.Contains(p, "//") || strings.Contains(p, "/.") {
		p = cleanPath(p)
	}

	if fold {
		// strings.ToLower returns its argument, unallocated, when nothing changes.
		return strings.ToLower(p)
	}

	return p
}

// cleanPath decodes p (Go has decoded it once already) up to maxDecodes more
// times, drops the ";" parameters of every segment, reads "\" as "/", and
// resolves dot segments and repeated slashes; a trailing slash stays, for
// prefixes to tell "/api/" from "/api" (exact route paths ignore it). The
// result starts with "/" and is at most one byte longer than p. Every step is
// a compiled standard-library call (regexp included), so that under Yaegi a
// long path costs compiled time, not an interpreted loop per byte or segment.
func cleanPath(p string) string {
	for i := 0; i < maxDecodes && strings.IndexByte(p, '%') >= 0; i++ {
		d, err := url.PathUnescape(p)
		if err != nil {
			d = lenientUnescape(p)
		}

		if d == p {
			break
		}

		p = d
	}

	// Still encoded after the bound (no backend decodes that often): each "%"
	// that would start an escape is made one that cannot, so that the form is
	// stable, CanonicalPath(CanonicalPath(p)) == CanonicalPath(p), and no
	// longer than p.
	if strings.IndexByte(p, '%') >= 0 {
		p = validEscape.ReplaceAllString(p, "%!${1}")
	}

	if strings.IndexByte(p, '\\') >= 0 {
		p = strings.ReplaceAll(p, `\`, "/")
	}

	if strings.IndexByte(p, ';') >= 0 {
		p = dropParams(p)
	}

	// Rooted, so that ".." never climbs above "/".
	c := path.Clean("/" + p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}

	return c
}

var (
	// params is a segment's ";" parameters: from a ";" to the next "/".
	params = regexp.MustCompile(`;[^/]*`)

	// escaped is a "%" escaped as "%25" and the two hex digits that follow it.
	escaped = regexp.MustCompile(`%25([0-9A-Fa-f]{2})`)
	// validEscape is a "%" and the two hex digits of an escape.
	// canonical matches a path that cleanPath may change, canonicalLower
	// one that it or strings.ToLower may change: one compiled call for the
	// usual path, where each call from Yaegi allocates.
	canonical      = regexp.MustCompile(`[%;\\]|//|/\.`)
	canonicalLower = regexp.MustCompile(`[%;\\A-Z\x80-\x{10FFFF}]|//|/\.`)
	validEscape    = regexp.MustCompile(`%([0-9A-Fa-f]{2})`)
)

// dropParams removes from every segment of p what follows its first ";".
func dropParams(p string) string {
	return params.ReplaceAllString(p, "")
}

// lenientUnescape decodes the valid escapes of p and keeps each other "%" as
// it is, as lenient backends do, where url.PathUnescape refuses the whole
// path: every "%" is escaped, then those that start an escape are restored.
func lenientUnescape(p string) string {
	d, err := url.PathUnescape(escaped.ReplaceAllString(strings.ReplaceAll(p, "%", "%25"), "%${1}"))
	if err != nil {
		return p
	}

	return d
}

// CanonicalPattern is a configured route path or asset prefix in the form
// requests are compared in: canonical, and in lower case unless caseSensitive.
func CanonicalPattern(p string, caseSensitive bool) string {
	return CanonicalPath(p, !caseSensitive)
}

// WithTrailingSlash is the set of paths, each with and without a trailing
// slash: a route's exact paths, which match with or without one; nil for
// none.
func WithTrailingSlash(paths map[string]bool) map[string]bool {
	if len(paths) == 0 {
		return nil
	}

	out := make(map[string]bool, 2*len(paths))
	for path := range paths {
		out[path] = true
		out[path+"/"] = true
	}

	return out
}

// HasAnyPrefix reports whether path starts with one of prefixes.
func HasAnyPrefix(path string, prefixes []string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}

	return false
}
