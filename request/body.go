package request

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// MaxBodyMembers bounds the members BodyValue looks at in each object on
// its path when the body holds many: a body with more states no value. A
// request's JSON names a few dozen; the bound keeps a body of millions of
// tiny members from costing seconds of interpreted loop (the root's doc.go:
// cost) or a map of them.
const MaxBodyMembers = 1024

// bodyBlock is the size of the blocks a body of unknown length is read in:
// kept as read, never copied into a larger one.
const bodyBlock = 32 << 10

// BodyValue returns the value at path (object members, outermost first) in
// req's JSON body, if the body ends within max bytes: a string (decoded)
// or a number as written. ok is false when the body is longer, is not one
// JSON object, or holds no such value, or an empty string, or one of
// another type there. The value is the one encoding/json decodes: member
// names matched exactly, a duplicated member read as its last occurrence,
// as the backend reads it. A body whose Content-Length is above max is not
// read at all.
//
// What BodyValue reads is put back: req.Body becomes those bytes followed
// by the rest of the body, so the next handler reads the body unchanged
// (ContentLength kept). It keeps what it read, at most max bytes and a
// block, and, for the time of the call, a copy of the members on the path
// or, in a body of many members, the decoder's copy of the longest value
// it skips (two to four times its size).
func BodyValue(req *http.Request, path []string, max int64) (string, bool) {
	body := req.Body
	if body == nil || body == http.NoBody || req.ContentLength == 0 || req.ContentLength > max {
		return "", false
	}

	if req.ContentLength > 0 {
		return sizedBodyValue(req, path)
	}

	blocks, complete := readBody(body, max)

	v := ""
	ok := false

	switch {
	case !complete:
	case len(blocks) == 1:
		v, ok = valueIn(blocks[0], path)
	default:
		v, ok = streamedValue(blockReader(blocks, nil), path)
	}

	req.Body = io.NopCloser(blockReader(blocks, body))

	return v, ok
}

// sizedBodyValue is BodyValue for a body whose Content-Length is known
// (and within max): read whole into one slice, which the body becomes.
func sizedBodyValue(req *http.Request, path []string) (string, bool) {
	b := make([]byte, req.ContentLength)
	n, err := io.ReadFull(req.Body, b)

	req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b[:n]), req.Body))

	if err != nil {
		return "", false
	}

	return valueIn(b, path)
}

// valueIn is the value at path in data, a whole JSON value: decoded level
// by level into raw members (memberValue), in one call of compiled code
// each, unless data may hold more than MaxBodyMembers members (colons),
// then through a decoder (streamedValue).
func valueIn(data []byte, path []string) (string, bool) {
	if len(path) > 0 && bytes.Count(data, colon) > MaxBodyMembers {
		return streamedValue(bytes.NewReader(data), path)
	}

	return memberValue(data, path)
}

var colon = []byte{':'}

// streamedValue is the value at path in the JSON value r reads, which
// nothing may follow but spaces.
func streamedValue(r io.Reader, path []string) (string, bool) {
	dec := json.NewDecoder(r)
	dec.UseNumber()

	v, ok := objectValue(dec, path)
	if _, err := dec.Token(); err != io.EOF {
		return "", false
	}

	return v, ok
}

// readBody reads body, of unknown length, until it ends or more than max
// bytes are read, and returns what it read and whether the body ended
// within max bytes.
func readBody(body io.Reader, max int64) ([][]byte, bool) {
	var blocks [][]byte

	total := int64(0)
	for total <= max {
		b := make([]byte, bodyBlock)
		n, err := io.ReadFull(body, b)
		total += int64(n)

		if n > 0 {
			blocks = append(blocks, b[:n])
		}

		if err != nil {
			// io.EOF or io.ErrUnexpectedEOF: the body ended.
			return blocks, (err == io.EOF || err == io.ErrUnexpectedEOF) && total <= max
		}
	}

	return blocks, false
}

// blockReader reads blocks, then rest (nil: none).
func blockReader(blocks [][]byte, rest io.Reader) io.Reader {
	readers := make([]io.Reader, 0, len(blocks)+1)
	for _, b := range blocks {
		readers = append(readers, bytes.NewReader(b))
	}

	if rest != nil {
		readers = append(readers, rest)
	}

	return io.MultiReader(readers...)
}

// objectValue reads the JSON object dec is at and returns the value at path
// in it (BodyValue).
func objectValue(dec *json.Decoder, path []string) (string, bool) {
	if d, ok := nextDelim(dec); !ok || d != '{' {
		return "", false
	}

	v := ""
	found := false

	for n := 0; dec.More(); n++ {
		tok, err := dec.Token()
		name, isName := tok.(string)

		if err != nil || !isName || n >= MaxBodyMembers {
			return "", false
		}

		if name != path[0] {
			if !skipValue(dec) {
				return "", false
			}

			continue
		}

		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return "", false
		}

		// A later member of the same name replaces this one, found or not.
		v, found = valueIn(raw, path[1:])
	}

	if d, ok := nextDelim(dec); !ok || d != '}' {
		return "", false
	}

	return v, found
}

// memberValue is the value at path in raw: raw itself when path is empty,
// else the value at path[1:] in raw's member path[0], raw being an object.
// Each level is decoded into its raw members, never further.
func memberValue(raw []byte, path []string) (string, bool) {
	if len(path) > 0 {
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil || members[path[0]] == nil {
			return "", false
		}

		return valueIn(members[path[0]], path[1:])
	}

	// A member's value, as encoding/json hands it over: no spaces around.
	if len(raw) == 0 {
		return "", false
	}

	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || s == "" {
			return "", false
		}

		return s, true
	case c == '-' || c >= '0' && c <= '9':
		return string(raw), true
	}

	return "", false
}

// nextDelim reads the next token, which must be a delimiter.
func nextDelim(dec *json.Decoder) (json.Delim, bool) {
	tok, err := dec.Token()
	if err != nil {
		return 0, false
	}

	d, ok := tok.(json.Delim)

	return d, ok
}

// skipValue reads past the next value, whatever it is, in one call of
// compiled code: decoding into an empty struct keeps nothing, and a value
// that is not an object only reports a type mismatch, after reading it.
func skipValue(dec *json.Decoder) bool {
	var skip struct{}

	err := dec.Decode(&skip)
	if err == nil {
		return true
	}

	_, mismatch := err.(*json.UnmarshalTypeError)

	return mismatch
}
