package usage

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tierlimit/tierlimit/request"
)

// Source is where a response states what its request cost: a header (or
// trailer), or a dotted path into a JSON body or into the events of a
// text/event-stream body. Exactly one of Header and Path is set.
type Source struct {
	// Header is the canonical name (http.CanonicalHeaderKey) of the header
	// or trailer that holds the cost, for "header:<Name>".
	Header string
	// Path is the object members leading to the cost, outermost first, for
	// "json:<dotted.path>".
	Path []string
	// LLM is an llm: variable (llmInput...), in an expression only
	// (ParseExpr); 0 otherwise.
	LLM int
	// Spec is the source as written, which events name.
	Spec string
}

// The two forms of a source, and the bounds of a path.
const (
	prefixHeader = "header:"
	prefixJSON   = "json:"

	// MaxPathSegments is the most members a path names.
	MaxPathSegments = 8
	// MaxSegmentBytes is the longest member name a path holds, in bytes.
	MaxSegmentBytes = 64
)

// ErrSource is what every error of ParseSource wraps (errors.Is).
var ErrSource = errors.New("costFrom")

// ParseSource reads "header:<Name>" or "json:<dotted.path>". The prefixes
// are lower case and nothing is trimmed. A header name is an HTTP token. A
// path is 1 to MaxPathSegments member names separated by dots, each 1 to
// MaxSegmentBytes bytes of UTF-8 with no control character; a member whose
// name holds a dot cannot be named. A path names object members only: a
// segment of digits alone ("choices.0.x") would read as an array index, which
// is not supported, so it is refused rather than matched against a member
// named "0".
func ParseSource(spec string) (Source, error) {
	if strings.HasPrefix(spec, prefixHeader) {
		name := spec[len(prefixHeader):]
		if !request.ValidToken(name) {
			return Source{}, sourceError(spec, "the header name "+strconv.Quote(name)+" is not an HTTP token")
		}

		return Source{Header: http.CanonicalHeaderKey(name), Spec: spec}, nil
	}

	if !strings.HasPrefix(spec, prefixJSON) {
		return Source{}, sourceError(spec, `must start with "header:" or "json:"`)
	}

	path := spec[len(prefixJSON):]

	if path == "" {
		return Source{}, sourceError(spec, "an empty path")
	}

	segments := strings.Split(path, ".")
	if len(segments) > MaxPathSegments {
		return Source{}, sourceError(spec, "more than "+strconv.Itoa(MaxPathSegments)+" path segments")
	}

	for i, s := range segments {
		if why := checkSegment(s); why != "" {
			return Source{}, sourceError(spec, "path segment "+strconv.Itoa(i+1)+" "+why)
		}
	}

	return Source{Path: segments, Spec: spec}, nil
}

func sourceError(spec, why string) error {
	return fmt.Errorf("%w %q: %s", ErrSource, spec, why)
}

// checkSegment tells why s is not a path segment: "" when it is one.
func checkSegment(s string) string {
	if s == "" {
		return "is empty"
	}

	if len(s) > MaxSegmentBytes {
		return "is longer than " + strconv.Itoa(MaxSegmentBytes) + " bytes"
	}

	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}

	if strings.IndexFunc(s, isControl) >= 0 {
		return "holds a control character"
	}

	if strings.Trim(s, "0123456789") == "" {
		return strconv.Quote(s) + " is all digits: array indexes are not supported"
	}

	return ""
}

func isControl(c rune) bool {
	return c < ' ' || c == 0x7f
}
