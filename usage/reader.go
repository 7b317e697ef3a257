package usage

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// The bounds of what a Reader keeps (doc.go: memory).
const (
	// MaxJSONBody is the longest JSON body read, in bytes: a longer body
	// states no cost.
	MaxJSONBody = 1 << 20
	// MaxEventBytes is the most data of one event of a text/event-stream
	// body kept, in bytes (its data lines joined by "\n"): a longer event is
	// skipped, and the events after it are read as usual.
	MaxEventBytes = 64 << 10
)

// Reader reads the cost a response body states, from the chunks of the body
// as they are written (Feed), without keeping more than MaxJSONBody of a
// JSON body or MaxEventBytes of an event. Its zero value reads nothing:
// make one with NewReader. One Reader reads one body, from one goroutine.
type Reader struct {
	// mode is how Feed reads: modePlain the body as it comes, one json: path
	// alone or an expression (expr); modeSkip nothing; modeCompressed
	// through a decoder into inner (inflate.go).
	mode int
	expr *Expr // an expression other than one json: path alone; nil: path
	path []string
	// quoted is the last segment in quotes: an event whose data holds it
	// nowhere, nor a \u escape, cannot hold the path, and is skipped
	// unparsed. It is nil, and every event parsed, when the segment holds a
	// character JSON may also write with a short escape (\/, \", \\) or
	// U+FFFD, which an invalid byte decodes to.
	quoted []byte
	stream bool // a text/event-stream body
	done   bool // Result was called

	buf  []byte // the JSON body, or the data of the current event
	over bool   // the body, or the current event, passed its bound

	// The current line of an event stream.
	phase     int  // what the line's next byte is (phase*)
	matched   int  // bytes of the BOM or of "data:" matched at the line's start
	dataLines int  // the data lines of the current event
	cr        bool // the last line ended with '\r': a '\n' right after it ends nothing

	cost int64
	ok   bool

	// An expression's: what each term's source stated last (by term; bit i
	// of stated: term i was stated), the llm: fields (llm.go), and the
	// response's header, read at the end.
	vals   []int64
	stated uint32
	fields [nFields]int64
	set    uint32
	header http.Header

	// modeCompressed: the *Reader of the decoded body, and its decoder.
	// Neither type names the Reader: Yaegi cannot assign to a field of a
	// type that refers to itself.
	inner interface{}
	z     *inflater
}

// The modes of a Reader.
const (
	modePlain = iota
	modeSkip
	modeCompressed
)

// The phases of a line of an event stream.
const (
	phaseBOM   = iota // the stream's first line, which may start with a UTF-8 BOM
	phaseField        // matching the line's start against "data:"
	phaseSpace        // right after "data:": one space there is not data
	phaseData         // the rest of a data line
	phaseSkip         // the rest of any other line
)

const (
	dataField   = "data:"
	byteOrder   = "\xEF\xBB\xBF"
	eventStream = "text/event-stream"
)

// NewReader returns a Reader of the cost at src (a json: path) in a body
// of the given Content-Type: text/event-stream (parameters and case aside)
// is read as events, anything else as one JSON value. A header source
// reads nothing from the body: its Result is always (0, false). Open reads
// an expression.
func NewReader(src Source, contentType string) *Reader {
	if src.Header != "" {
		return &Reader{mode: modeSkip}
	}

	e := Expr{Terms: []Term{{Weight: 1000, Source: src}}, Spec: src.Spec, path: src.Path}
	e.needles = needlesOf(e.Terms)
	if e.needles != nil {
		e.quoted = e.needles[0]
	}

	return Open(&e, http.Header{"Content-Type": {contentType}})
}

// Open returns a Reader of the cost that e states in a response whose
// header is h (which it keeps, for e's header: terms and the trailers
// Result reads): its body is read as NewReader says, decoded first when
// its Content-Encoding is gzip or deflate (inflate.go); a body in another
// coding states nothing.
func Open(e *Expr, h http.Header) *Reader {
	ct := ""
	if v := h["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}

	r := &Reader{path: e.path, quoted: e.quoted, stream: isEventStream(ct)}
	if e.path == nil || h["Content-Encoding"] != nil {
		openOther(r, e, h)
	}

	return r
}

// openOther is Open for a Reader other than one json: path alone read as
// it comes: an expression's, or a compressed body's.
func openOther(r *Reader, e *Expr, h http.Header) {
	if e.path == nil {
		r.expr = e
		r.quoted = nil
		r.vals = make([]int64, len(e.Terms))
		r.header = h

		if !readsBody(e) {
			r.mode = modeSkip
			return
		}
	}

	coding := readableCoding(h["Content-Encoding"])
	switch coding {
	case codingIdentity:
	case codingNone:
		r.mode = modeSkip
	default:
		inner := *r
		r.inner = &inner
		r.mode = modeCompressed
		r.z = &inflater{coding: coding}
	}
}

// readsBody reports whether some term of e reads the body.
func readsBody(e *Expr) bool {
	for _, t := range e.Terms {
		if t.Source.Header == "" {
			return true
		}
	}

	return false
}

func isEventStream(contentType string) bool {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = contentType[:i]
	}

	return strings.EqualFold(strings.TrimSpace(contentType), eventStream)
}

// Feed reads the next chunk of the body. Chunks may split the body
// anywhere (inside a line, a line ending, a number or a UTF-8 sequence):
// the result does not depend on where. Feed keeps no reference to b. After
// Result, Feed does nothing.
func Feed(r *Reader, b []byte) {
	if r.done || r.mode != modePlain {
		if !r.done && r.mode == modeCompressed {
			feedCompressed(r, b)
		}

		return
	}

	if r.stream {
		feedStream(r, b)
		return
	}

	if r.over {
		return
	}

	if len(r.buf)+len(b) > MaxJSONBody {
		r.over = true
		r.buf = nil

		return
	}

	r.buf = appendBounded(r.buf, b, MaxJSONBody)
}

// Result ends the body and returns the cost it states: for a JSON body, the
// value at the path; for an event stream, the value at the path in the last
// event that holds a valid one. ok is false when there is none. It may be
// called again, with the same answer.
func Result(r *Reader) (int64, bool) {
	if !r.done {
		r.done = true
		finish(r)
	}

	return r.cost, r.ok
}

// Streams reports whether r reads its body as an event stream, whose
// events may state a cost before it ends (Stated).
func Streams(r *Reader) bool {
	return r.stream
}

// Stated returns the cost the complete events of a stream read so far
// state (the last that holds one), without ending the body: a later event
// may state another, which Result then returns. A JSON body states nothing
// before Result.
func Stated(r *Reader) (int64, bool) {
	return r.cost, r.ok
}

func finish(r *Reader) {
	if r.mode != modePlain || r.expr != nil {
		finishOther(r)
		return
	}

	if r.stream {
		// A stream that ends without its last blank line still ends its
		// last event (doc.go: events). Its last line needs no ending: a data
		// line's value is in the data already, and a bare "data" would only
		// add a "\n" to it, which changes no JSON.
		endEvent(r)
		r.buf = nil

		return
	}

	if !r.over {
		cost, ok := lookup(r.buf, r.path)
		r.cost = cost
		r.ok = ok
	}

	r.buf = nil
}

// appendBounded appends b to buf, which must have room for it within limit,
// growing its capacity no further than limit.
func appendBounded(buf, b []byte, limit int) []byte {
	n := len(buf) + len(b)
	if n <= cap(buf) {
		return append(buf, b...)
	}

	c := 2 * cap(buf)
	if c < n {
		c = n
	}

	if c < 512 {
		c = 512
	}

	if c > limit {
		c = limit
	}

	grown := make([]byte, n, c)
	copy(grown, buf)
	copy(grown[len(buf):], b)

	return grown
}

// lookup returns the cost at path in the JSON value data: a number that
// ParseHeaderValue takes. Each level is decoded into raw members, so nothing but
// the members on the path is decoded further.
func lookup(data []byte, path []string) (int64, bool) {
	raw := json.RawMessage(data)

	for i := 0; i < len(path); i++ {
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil {
			return 0, false
		}

		v, found := members[path[i]]
		if !found {
			return 0, false
		}

		raw = v
	}

	return ParseHeaderValue(string(bytes.TrimSpace(raw)))
}
