package usage

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseSource(t *testing.T) {
	for _, c := range []struct {
		spec string
		want Source
	}{
		{"header:X-Tokens-Used", Source{Header: "X-Tokens-Used"}},
		{"header:x-tokens-used", Source{Header: "X-Tokens-Used"}}, // canonical
		{"header:openai-usage", Source{Header: "Openai-Usage"}},
		{"json:usage.total_tokens", Source{Path: []string{"usage", "total_tokens"}}},
		{"json:tokens", Source{Path: []string{"tokens"}}},
		{"json:a.b.c.d.e.f.g.h", Source{Path: []string{"a", "b", "c", "d", "e", "f", "g", "h"}}}, // 8 segments
		{"json:" + strings.Repeat("x", 64), Source{Path: []string{strings.Repeat("x", 64)}}},     // 64 bytes
		{"json:usage.Total Tokens", Source{Path: []string{"usage", "Total Tokens"}}},             // case and spaces kept
		{"json:a1.2b.x0", Source{Path: []string{"a1", "2b", "x0"}}},                              // digits among letters
		{"json:données.coût", Source{Path: []string{"données", "coût"}}},
	} {
		got, err := ParseSource(c.spec)
		c.want.Spec = c.spec
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseSource(%q) = %#v, %v, want %#v", c.spec, got, err, c.want)
		}
	}
}

func TestParseSourceErrors(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"", `costFrom "": must start with "header:" or "json:"`},
		{"xml:a", `costFrom "xml:a": must start with "header:" or "json:"`},
		{"Header:X", `costFrom "Header:X": must start with "header:" or "json:"`},
		{"usage.total_tokens", `must start with "header:" or "json:"`},
		{"header:", `costFrom "header:": the header name "" is not an HTTP token`},
		{"header:X Tokens", `the header name "X Tokens" is not an HTTP token`},
		{"header: X", `the header name " X" is not an HTTP token`},
		{"header:a:b", `the header name "a:b" is not an HTTP token`},
		{"header:été", `is not an HTTP token`},
		{"json:", `costFrom "json:": an empty path`},
		{"json:a..b", `costFrom "json:a..b": path segment 2 is empty`},
		{"json:.a", `path segment 1 is empty`},
		{"json:a.", `path segment 2 is empty`},
		{"json:a.b.c.d.e.f.g.h.i", `costFrom "json:a.b.c.d.e.f.g.h.i": more than 8 path segments`},
		{"json:a." + strings.Repeat("x", 65), `path segment 2 is longer than 64 bytes`},
		{"json:choices.0.usage", `path segment 2 "0" is all digits: array indexes are not supported`},
		{"json:a.\xff", `path segment 2 is not valid UTF-8`},
		{"json:a\tb", `path segment 1 holds a control character`},
		{"json:a\x7f", `path segment 1 holds a control character`},
	} {
		_, err := ParseSource(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSource(%q) = %v, want an error with %q", c.spec, err, c.want)
			continue
		}

		if !errors.Is(err, ErrSource) {
			t.Errorf("ParseSource(%q) = %v, which does not wrap ErrSource", c.spec, err)
		}
	}
}

func TestParseHeaderValue(t *testing.T) {
	for _, c := range []struct {
		v    string
		want int64
		ok   bool
	}{
		{"400", 400, true},
		{"0", 0, true},
		{" 400 ", 400, true},
		{"\t400\t", 400, true},
		{"0400", 400, true},
		{"400.0", 400, true},
		{"400.000", 400, true},
		{"4e2", 400, true},
		{"4E+2", 400, true},
		{"4.00e2", 400, true},
		{"40000e-2", 400, true},
		{"4.5e1", 45, true},
		{"0.0", 0, true},
		{"0e-5", 0, true},
		{"999999999999999999", 999999999999999999, true}, // 18 digits
		{"9.99999999999999999e17", 999999999999999999, true},
		{"1e17", 100000000000000000, true},
		{"1000000000000000000", 0, false}, // 19 digits: 10^18
		{"1e18", 0, false},
		{"9223372036854775807", 0, false},
		{"99999999999999999999999", 0, false},
		{"1e999999999", 0, false},
		{"1e-999999999", 0, false},
		{"", 0, false},
		{"   ", 0, false},
		{"-1", 0, false},
		{"-0", 0, false},
		{"+400", 0, false},
		{"400.5", 0, false},
		{"4e-1", 0, false},
		{"0.5", 0, false},
		{"45e-1", 0, false},
		{"400.", 0, false},
		{".5", 0, false},
		{"4e", 0, false},
		{"4e+", 0, false},
		{"0x10", 0, false},
		{"1_000", 0, false},
		{"400 tokens", 0, false},
		{"4 00", 0, false},
		// A list (ParseHeaderValues): its largest member.
		{"4,5", 5, true},
		{"5 , 4", 5, true},
		{"4,,", 4, true},
		{",", 0, false},
		{"4, five", 0, false},
		{"4, -1", 0, false},
		{`"400"`, 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"٤٠٠", 0, false}, // Arabic-Indic digits
		{"400\n", 0, false},
		{strings.Repeat("0", 63) + "40", 0, false}, // 65 bytes: 64 is the most
		{strings.Repeat("0", 62) + "40", 40, true},
	} {
		got, ok := ParseHeaderValue(c.v)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseHeaderValue(%q) = %d, %v, want %d, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}
