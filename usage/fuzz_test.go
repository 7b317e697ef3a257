package usage

import (
	"math/big"
	"regexp"
	"strings"
	"testing"
)

var fuzzPaths = []string{"json:usage.total_tokens", "json:n", "json:a.b"}

// FuzzFeed feeds random bytes whole and in random chunks (each byte of
// splits is the length of the next chunk, 0 an empty one; the rest goes
// last): it never panics, never lets a buffer pass its bound, and gives the
// same result both ways.
func FuzzFeed(f *testing.F) {
	for _, body := range []string{
		openAIStream,
		strings.ReplaceAll(openAIStream, "\n", "\r\n"),
		chatCompletion,
		"data: {\"usage\":{\"total_tokens\":4}}\r\r: x\rdata\n\n",
		"\xEF\xBB\xBFdata:{\"n\":4.0e1}",
		`{"a":{"b":7}}`,
		"data: {\"a\":{\"b\":1}}\n\ndata: {\"a\":{\"b\":2}\n",
	} {
		f.Add([]byte(body), []byte{1, 0, 3, 250, 7}, true, uint8(0))
		f.Add([]byte(body), []byte{5, 13}, false, uint8(2))
	}

	f.Fuzz(func(t *testing.T, body, splits []byte, stream bool, which uint8) {
		src, err := ParseSource(fuzzPaths[int(which)%len(fuzzPaths)])
		if err != nil {
			t.Fatal(err)
		}

		contentType := "application/json"
		limit := MaxJSONBody

		if stream {
			contentType = "text/event-stream; charset=utf-8"
			limit = MaxEventBytes
		}

		whole := NewReader(src, contentType)
		Feed(whole, body)
		want, wantOK := Result(whole)

		r := NewReader(src, contentType)
		rest := body

		for _, n := range splits {
			k := int(n)
			if k > len(rest) {
				k = len(rest)
			}

			Feed(r, rest[:k])
			rest = rest[k:]

			if cap(r.buf) > limit {
				t.Fatalf("a buffer of capacity %d, above %d", cap(r.buf), limit)
			}
		}

		Feed(r, rest)

		got, ok := Result(r)
		if got != want || ok != wantOK {
			t.Fatalf("in chunks %v: %d, %v; whole: %d, %v", splits, got, ok, want, wantOK)
		}

		if ok && got < 0 {
			t.Fatalf("a negative cost %d", got)
		}
	})
}

// streamPieces are what FuzzFeedPieces builds streams from, so that random
// streams often hold costs: a split that changes a result then shows.
var streamPieces = []string{
	"data: ", "data:", "data", ": c", "event: e", "\r", "\n", "\r\n", "\xEF\xBB\xBF",
	`{"usage":`, `{"total_tokens":`, "4", "0", ".0", "e1", "-", "}", "}}", "[DONE]", `"`, "\\u0034", " ",
}

// FuzzFeedPieces is FuzzFeed on event streams made of streamPieces: each
// byte of pieces picks one (its low 7 bits). The stream is read whole, one
// piece per chunk (so that chunks end between any two pieces: "\r" | "\n",
// "data" | ":", "{" | "...}"), and in chunks of the pieces up to each one
// whose byte has its high bit set.
func FuzzFeedPieces(f *testing.F) {
	// data: {"usage":{"total_tokens":4}}, CRLF, CRLF
	f.Add([]byte{0, 9, 10, 11, 17, 7, 7})
	// The same cost over two data lines, CR then LF; then [DONE].
	f.Add([]byte{0, 9, 5, 6, 0, 10, 11, 17, 6, 6, 0, 18, 6, 6})
	// BOM, data:{"usage": CR data:{"total_tokens":40} LF, ": c" CRLF, CR
	f.Add([]byte{8, 1 | 0x80, 9, 5, 1, 10 | 0x80, 11, 12, 17, 6, 3, 7, 5})

	src, _ := ParseSource("json:usage.total_tokens")

	f.Fuzz(func(t *testing.T, pieces []byte) {
		var body, chunk strings.Builder

		each := NewReader(src, "text/event-stream")
		flagged := NewReader(src, "text/event-stream")

		for _, p := range pieces {
			piece := streamPieces[int(p&0x7f)%len(streamPieces)]
			body.WriteString(piece)
			chunk.WriteString(piece)
			Feed(each, []byte(piece))

			if p&0x80 != 0 {
				Feed(flagged, []byte(chunk.String()))
				chunk.Reset()
			}
		}

		Feed(flagged, []byte(chunk.String()))

		whole := NewReader(src, "text/event-stream")
		Feed(whole, []byte(body.String()))
		want, wantOK := Result(whole)

		if got, ok := Result(each); got != want || ok != wantOK {
			t.Fatalf("%q a piece per chunk: %d, %v; whole: %d, %v", body.String(), got, ok, want, wantOK)
		}

		if got, ok := Result(flagged); got != want || ok != wantOK {
			t.Fatalf("%q in chunks: %d, %v; whole: %d, %v", body.String(), got, ok, want, wantOK)
		}
	})
}

// FuzzParseHeaderValue checks ParseHeaderValue against exact arithmetic
// (math/big) on the numbers it should take.
func FuzzParseHeaderValue(f *testing.F) {
	for _, v := range []string{"400", " 4.00e2 ", "0400", "1e17", "999999999999999999", "1e18", "45e-1", "-0", "0.0e-3000", "4e+9999"} {
		f.Add(v)
	}

	number := regexp.MustCompile(`^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)
	limit := new(big.Rat).SetInt64(1000000000000000000)

	f.Fuzz(func(t *testing.T, v string) {
		got, ok := ParseHeaderValue(v)

		s := strings.Trim(v, " \t")
		want := int64(0)
		wantOK := false

		if len(s) <= maxNumberBytes && number.MatchString(s) {
			if e := strings.IndexAny(s, "eE"); e >= 0 && len(strings.TrimLeft(strings.TrimLeft(s[e+1:], "+-"), "0")) > 3 {
				// An exponent beyond ±999: only a zero is whole and small.
				wantOK = strings.Trim(s[:e], "0.") == ""
			} else if r, isRat := new(big.Rat).SetString(s); isRat && r.IsInt() && r.Sign() >= 0 && r.Cmp(limit) < 0 {
				want = r.Num().Int64()
				wantOK = true
			}
		}

		if got != want || ok != wantOK {
			t.Fatalf("ParseHeaderValue(%q) = %d, %v, want %d, %v", v, got, ok, want, wantOK)
		}
	})
}
