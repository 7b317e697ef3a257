// Package usage reads what a backend's response says its request cost (an
// LLM's tokens, for instance), for a route's costFrom: the pure part, with
// no net/http handler and no state shared between responses. It imports the
// standard library and request (what an HTTP token is) only.
//
// ParseSource reads the two forms of a single source: "header:<Name>", a header or
// trailer whose value ParseHeaderValue reads, and "json:<dotted.path>"
// (json:usage.total_tokens), a member of a JSON body or of the events of a
// text/event-stream body, which a Reader reads from the body's chunks as
// the backend writes them: NewReader, Feed for each chunk, Result at the
// end. They are functions over a plain struct, not methods: under Yaegi a
// method call of our own types costs about four times a function call
// (doc.go in the root: functions, not methods).
//
// # Costs
//
// A cost is a non-negative number with an integral value below 10^18,
// written as JSON writes numbers: 400, 400.0 and 4e2 are 400; 400.5, -1,
// "400" (a JSON string), null, true and 1e18 state no cost. A header's value
// may have spaces around it and leading zeros. ParseHeaderValue tells the
// details; a JSON value and a header value are read by the same code.
//
// # Paths
//
// A path names object members, outermost first, matched exactly (case
// included) against the decoded member names; a duplicated member counts
// as its last occurrence, as encoding/json decodes it. It has 1 to 8
// segments of 1 to 64 bytes of UTF-8 without control characters. Array
// elements cannot be named: a segment of digits alone is refused, since it
// would read as an index. A member whose name holds a dot cannot be named.
// ParseSource's errors wrap ErrSource and read
// costFrom "<the value>": <what is wrong>.
//
// # Bodies
//
// A body whose Content-Type is text/event-stream (parameters and case
// aside) is read as events; any other body (application/json typically,
// and a missing Content-Type) as one JSON value, which must be an object
// holding the path. A body whose Content-Encoding is gzip or deflate is
// decoded first (inflate.go), its bounds counted in decoded bytes; one in
// another coding (br, zstd) states no cost, and NarrowAcceptEncoding keeps
// a request from asking for one.
//
// # Expressions
//
// ParseExpr reads a costFrom that is a weighted sum of sources, the llm:
// variables among them (expr.go, llm.go, terms.go), and Open makes the
// Reader of one from a response's header.
//
// # Events
//
// An event stream is read line by line as the HTML standard says (lines end
// at "\r\n", "\n" or "\r"; "data:" with one optional space; several data
// lines joined by "\n"; an empty line ends an event; a UTF-8 BOM at the
// start, comments and other fields such as event: and id: ignored). The
// cost is the one of the LAST event whose data is JSON holding the path
// with a valid cost, as OpenAI's final usage chunk: events whose data is
// not JSON (data: [DONE]), lacks the path (usage: null included) or holds
// no valid cost there are skipped and change nothing. Unlike the standard,
// which drops an event the stream ends before its blank line, the last
// event counts without it (many servers end that way); its data must still
// be complete JSON, so a stream cut inside an event does not count it.
//
// # Memory
//
// A Reader keeps one buffer, never the body beyond it, and grows it no
// further than its bound (capacity included), whatever the chunks:
//
//   - a JSON body: at most MaxJSONBody (1 MiB). A longer body states no cost
//     (the request keeps what it was charged before the response); its
//     buffer is dropped as soon as the body passes the bound.
//   - an event stream: the data of the current event, at most MaxEventBytes
//     (64 KiB). A longer event is skipped whole, the events after it are
//     read as usual; lines other than data lines are never kept, whatever
//     their length.
//
// Result drops the buffer. Decoding (in Result for a JSON body; at the end
// of an event whose data holds the path's last segment in quotes, or a \u
// escape that could write it: the other events are skipped unparsed) allocates,
// for the time of the call, in proportion to the data decoded: each level
// of the path is decoded into its raw members (map[string]json.RawMessage),
// never into a tree of values.
//
// Numbers are read from their text, never through float64: a cost is exact
// up to its bound.
package usage
