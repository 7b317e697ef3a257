package redisresp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// fuzzLimits are small, so that the fuzzer reaches every bound.
var fuzzLimits = Limits{MaxLine: 64, MaxBulk: 256, MaxElements: 64, MaxDepth: 4}

func FuzzReadReply(f *testing.F) {
	seeds := []string{
		// Valid.
		"+OK\r\n",
		"+\r\n",
		"-ERR msg\r\n",
		"-NOSCRIPT No matching script. Please use EVAL.\r\n",
		":123\r\n",
		":-5\r\n",
		":+7\r\n",
		":9223372036854775807\r\n",
		"$3\r\nfoo\r\n",
		"$0\r\n\r\n",
		"$-1\r\n",
		"$4\r\na\r\nb\r\n",
		"*2\r\n$3\r\nfoo\r\n:1\r\n",
		"*2\r\n*2\r\n:1\r\n+a\r\n*1\r\n$-1\r\n",
		"*-1\r\n",
		"*0\r\n",
		"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
		"*3\r\n:1\r\n-ERR inner\r\n*-1\r\n",
		"+OK\r\n:1\r\n$1\r\nx\r\n",
		"$256\r\n" + strings.Repeat("x", 256) + "\r\n",
		// Invalid.
		"",
		"\r\n",
		"?x\r\n",
		"+OK\n",
		"+OK",
		":12a\r\n",
		":\r\n",
		":9223372036854775808\r\n",
		"$999999999999\r\n",
		"$257\r\n" + strings.Repeat("x", 257) + "\r\n",
		"$-2\r\n",
		"$3\r\nfooXY\r\n",
		"$5\r\nab",
		"*-2\r\n",
		"*65\r\n",
		"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
		"*2\r\n*40\r\n",
		"*2\r\n*62\r\n" + strings.Repeat(":1\r\n", 63),
		"+" + strings.Repeat("a", 100) + "\r\n",
		"*2\r\n:1\r\n",
	}

	for _, s := range seeds {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		whole := readAll(data, fuzzLimits, false)
		oneByte := readAll(data, fuzzLimits, true)

		// Parsing does not depend on how the input is split into reads.
		if len(whole.values) != len(oneByte.values) || errClass(whole.err) != errClass(oneByte.err) {
			t.Fatalf("whole reads: %d values, %v; one-byte reads: %d values, %v",
				len(whole.values), whole.err, len(oneByte.values), oneByte.err)
		}

		for i, v := range whole.values {
			if !sameValue(v, oneByte.values[i]) {
				t.Fatalf("value %d: whole reads %#v, one-byte reads %#v", i, v, oneByte.values[i])
			}

			checkValue(t, v, fuzzLimits)
		}

		// Only three kinds of error: a protocol error, or the input ran out.
		switch err := whole.err; {
		case errors.Is(err, ErrProtocol), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		default:
			t.Fatalf("unexpected error %v (%T)", err, err)
		}

		// Through Conn.Do: the first reply is the same as the reader's first.
		c, _ := newFakeConn(string(data), fuzzLimits, false)

		v, err := c.Do(farDeadline(), "CMD")
		if len(whole.values) > 0 {
			if err != nil || !sameValue(v, whole.values[0]) {
				t.Fatalf("Conn.Do = %#v, %v; reader gave %#v", v, err, whole.values[0])
			}
		} else if err == nil {
			t.Fatalf("Conn.Do = %#v; the reader failed with %v", v, whole.err)
		} else if c.Err() == nil {
			t.Fatalf("Conn.Do failed with %v but the connection is not closed", err)
		}
	})
}

type readResult struct {
	values []Value
	err    error
}

// readAll reads replies until the first error.
func readAll(data []byte, lim Limits, oneByte bool) readResult {
	var in io.Reader = bytes.NewReader(data)
	if oneByte {
		in = iotest.OneByteReader(in)
	}

	r := reader{br: bufio.NewReaderSize(in, lim.MaxLine), lim: lim}

	var res readResult

	for {
		v, err := r.readReply()
		if err != nil {
			res.err = err
			return res
		}

		res.values = append(res.values, v)
	}
}

func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, ErrProtocol):
		return "protocol"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, io.EOF):
		return "EOF"
	default:
		return "other: " + err.Error()
	}
}

// checkValue asserts that v is well formed and within lim, and that it
// survives encoding and parsing again.
func checkValue(t *testing.T, v Value, lim Limits) {
	t.Helper()

	var st valueStats
	st.walk(t, v, 0)

	if st.values > lim.MaxElements {
		t.Fatalf("%d values in one reply, MaxElements is %d", st.values, lim.MaxElements)
	}

	if st.maxDepth > lim.MaxDepth {
		t.Fatalf("value at depth %d, MaxDepth is %d", st.maxDepth, lim.MaxDepth)
	}

	if st.bulkBytes > lim.MaxBulk {
		t.Fatalf("%d bulk bytes in one reply, MaxBulk is %d", st.bulkBytes, lim.MaxBulk)
	}

	enc := encodeValue(nil, v)

	again := readAll(enc, lim, false)
	if len(again.values) != 1 || !errors.Is(again.err, io.EOF) || errors.Is(again.err, ErrProtocol) {
		t.Fatalf("re-encoded %q: %d values, %v; want exactly one value", enc, len(again.values), again.err)
	}

	if !sameValue(again.values[0], v) {
		t.Fatalf("re-encoded %q parses to %#v, want %#v", enc, again.values[0], v)
	}

	if enc2 := encodeValue(nil, again.values[0]); !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding not stable: %q then %q", enc, enc2)
	}
}

type valueStats struct {
	values, maxDepth, bulkBytes int
}

func (st *valueStats) walk(t *testing.T, v Value, depth int) {
	t.Helper()

	st.values++
	if depth > st.maxDepth {
		st.maxDepth = depth
	}

	switch v.Kind {
	case KindSimple, KindError:
		if v.Null || v.Array != nil || v.Int != 0 {
			t.Fatalf("status value with other fields set: %#v", v)
		}

		if strings.ContainsAny(v.Str, "\n") {
			t.Fatalf("status value contains LF: %q", v.Str)
		}

		if len(v.Str)+3 > fuzzLimits.MaxLine {
			t.Fatalf("status value of %d bytes from lines of at most %d", len(v.Str), fuzzLimits.MaxLine)
		}
	case KindInteger:
		if v.Null || v.Array != nil || v.Str != "" {
			t.Fatalf("integer with other fields set: %#v", v)
		}
	case KindBulk:
		if v.Array != nil || v.Int != 0 || (v.Null && v.Str != "") {
			t.Fatalf("bulk with other fields set: %#v", v)
		}

		st.bulkBytes += len(v.Str)
	case KindArray:
		if v.Str != "" || v.Int != 0 || (v.Null && v.Array != nil) {
			t.Fatalf("array with other fields set: %#v", v)
		}

		for _, e := range v.Array {
			st.walk(t, e, depth+1)
		}
	default:
		t.Fatalf("value of unknown kind %q", v.Kind)
	}
}

// encodeValue appends v in canonical RESP2.
func encodeValue(b []byte, v Value) []byte {
	switch v.Kind {
	case KindSimple, KindError:
		b = append(b, v.Kind)
		b = append(b, v.Str...)
	case KindInteger:
		b = append(b, ':')
		b = strconv.AppendInt(b, v.Int, 10)
	case KindBulk:
		if v.Null {
			return append(b, "$-1\r\n"...)
		}

		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(v.Str)), 10)
		b = append(b, "\r\n"...)
		b = append(b, v.Str...)
	case KindArray:
		if v.Null {
			return append(b, "*-1\r\n"...)
		}

		b = append(b, '*')
		b = strconv.AppendInt(b, int64(len(v.Array)), 10)
		b = append(b, "\r\n"...)

		for _, e := range v.Array {
			b = encodeValue(b, e)
		}

		return b
	}

	return append(b, "\r\n"...)
}
