package tierlimit

import (
	"net/url"
	"path"
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

// reqPath is a request path in the forms matching compares: canonical, and
// canonical in lower case (equal to path when no matcher ignores case).
type reqPath struct {
	path   string
	folded string
}

// canonicalPaths returns the canonical form of the decoded URL path p, and
// that form in lower case when fold is set. Paths that hold nothing to
// canonicalise, the usual case, come back unchanged from a few compiled
// string searches: under Yaegi the rare work lives in cleanPath, whose frame
// only those requests pay for.
func canonicalPaths(p string, fold bool) reqPath {
	c := p
	if p == "" || p[0] != '/' || (len(p) > 1 && p[len(p)-1] == '/') ||
		strings.ContainsAny(p, `%;\`) || strings.Contains(p, "//") || strings.Contains(p, "/.") {
		c = cleanPath(p)
	}

	if fold {
		// strings.ToLower returns its argument, unallocated, when nothing changes.
		return reqPath{path: c, folded: strings.ToLower(c)}
	}

	return reqPath{path: c, folded: c}
}

// cleanPath decodes p (Go has decoded it once already) up to maxDecodes more
// times, drops the ";" parameters of every segment, reads "\" as "/", and
// resolves dot segments, repeated slashes and a trailing slash. The result
// starts with "/" and is no longer than p (or "/"). Every step is a compiled
// standard-library call or a loop over ";" only, so a long path costs
// compiled time.
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

	if strings.IndexByte(p, '\\') >= 0 {
		p = strings.ReplaceAll(p, `\`, "/")
	}

	if strings.IndexByte(p, ';') >= 0 {
		p = dropParams(p)
	}

	// Rooted, so that ".." never climbs above "/".
	return path.Clean("/" + p)
}

// dropParams removes from every segment of p what follows its first ";".
func dropParams(p string) string {
	var b strings.Builder

	b.Grow(len(p))

	for {
		i := strings.IndexByte(p, ';')
		if i < 0 {
			b.WriteString(p)
			break
		}

		b.WriteString(p[:i])
		p = p[i:]

		j := strings.IndexByte(p, '/')
		if j < 0 {
			break
		}

		p = p[j:]
	}

	return b.String()
}

// lenientUnescape decodes the valid escapes of p and keeps the other "%" as
// they are, as lenient backends do; url.PathUnescape refuses the whole path.
func lenientUnescape(p string) string {
	var b strings.Builder

	b.Grow(len(p))

	for {
		i := strings.IndexByte(p, '%')
		if i < 0 {
			b.WriteString(p)
			break
		}

		b.WriteString(p[:i])
		p = p[i:]

		if len(p) >= 3 && isHex(p[1]) && isHex(p[2]) {
			b.WriteByte(unhex(p[1])<<4 | unhex(p[2]))
			p = p[3:]

			continue
		}

		b.WriteByte('%')
		p = p[1:]
	}

	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

// canonicalPattern is a configured route path or asset prefix in the form
// requests are compared in: canonical, lower case unless caseSensitive, and a
// prefix (ending in "/") still ending in "/".
func canonicalPattern(p string, caseSensitive bool) string {
	c := canonicalPaths(p, !caseSensitive).folded
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}

	return c
}

// hasPrefixPath reports whether the canonical path c is under one of the
// canonical prefixes. A prefix ending in "/" also matches c without that
// slash, since c never ends in one: "/api/" matches "/api/" and "/api".
func hasPrefixPath(c string, prefixes []string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(c, prefix) || len(c)+1 == len(prefix) && prefix[len(c)] == '/' && strings.HasPrefix(prefix, c) {
			return true
		}
	}

	return false
}
