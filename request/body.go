package request

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// MaxBodyMembers bounds the members BodyValue looks at in each object on
// its path: a body with more states no value. A request's JSON names a few
// dozen; the bound keeps a body of millions of tiny members from costing
// seconds of interpreted loop (the root's doc.go: cost).
const MaxBodyMembers = 1024

// bodyBlock is the size of the blocks a body of unknown length is read in:
// kept as read, never copied into a larger one.
const bodyBlock = 32 << 10

// BodyValue returns the value at path (object members, outermost first) in
// req's JSON body, if the body ends within max bytes: a string (decoded)
// or a number as written. ok is false when the body is longer, is not a
// JSON object, or holds no such value, or an empty string, or one of
// another type there. The value is the one encoding/json would decode:
// member names matched exactly, a duplicated member read as its last
// occurrence, so that the backend reads the same value. A body whose
// Content-Length is above max is not read at all.
//
// What BodyValue reads is put back: req.Body becomes those bytes followed
// by the rest of the body, so the next handler reads the body unchanged
// (ContentLength kept). It keeps what it read, at most max bytes and a
// block, and, for the time of the call, the decoder's copy of the longest
// value it skips (two to four times its size).
func BodyValue(req *http.Request, path []string, max int64) (string, bool) {
	body := req.Body
	if body == nil || body == http.NoBody || req.ContentLength == 0 || req.ContentLength > max {
		return "", false
	}

	blocks, complete := readBody(body, req.ContentLength, max)

	v := ""
	ok := false

	if complete {
		dec := json.NewDecoder(blockReader(blocks, nil))
		dec.UseNumber()
		v, ok = objectValue(dec, path)
	}

	req.Body = io.NopCloser(blockReader(blocks, body))

	return v, ok
}

// readBody reads body, of the given length (-1: unknown), until it ends or
// more than max bytes are read, and returns what it read and whether the
// body ended within max bytes. A body of known length is read into one
// block of that length.
func readBody(body io.Reader, length, max int64) ([][]byte, bool) {
	var blocks [][]byte

	total := int64(0)
	for total <= max {
		size := length
		if size < 0 {
			size = bodyBlock
		}

		b := make([]byte, size)
		n, err := io.ReadFull(body, b)
		total += int64(n)

		if n > 0 {
			blocks = append(blocks, b[:n])
		}

		if err != nil || length >= 0 {
			// The body ended (io.EOF, io.ErrUnexpectedEOF), failed, or was
			// read to its length.
			return blocks, (err == nil || err == io.EOF || err == io.ErrUnexpectedEOF && length < 0) && total <= max
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
		v, found = memberValue(raw, path[1:])
	}

	if d, ok := nextDelim(dec); !ok || d != '}' {
		return "", false
	}

	return v, found
}

// memberValue is the value at path in raw, the value of a member on the
// path: the value itself when path is empty.
func memberValue(raw json.RawMessage, path []string) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(path) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()

		return objectValue(dec, path)
	}

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
