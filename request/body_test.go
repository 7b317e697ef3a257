package request

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestBodyValueReadsTheMemberAndPutsTheBodyBack(t *testing.T) {
	long := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 200<<10) + `"}],"temperature":0.5,`
	// Past MaxBodyMembers colons, the body is read through a decoder.
	colons := `{"messages":[{"role":"user","content":"` + strings.Repeat("a: b ", 2000) + `"}],`
	cases := []struct {
		name, body, path, want string
		max                    int64
		ok                     bool
	}{
		{"after 200 KB", long + `"model":"gpt-4o"}`, "model", "gpt-4o", 1 << 20, true},
		{"a number as written", `{"n":1e2}`, "n", "1e2", 1 << 20, true},
		{"escapes decoded", `{"model":"gpt\u002d4o"}`, "model", "gpt-4o", 1 << 20, true},
		{"nested", `{"a":{"x":[1,2],"b":"v"}}`, "a.b", "v", 1 << 20, true},
		{"last duplicate wins", `{"model":"mini","x":1,"model":"gpt-4o"}`, "model", "gpt-4o", 1 << 20, true},
		{"a duplicate parent replaces", `{"a":{"b":"v"},"a":{"c":1}}`, "a.b", "", 1 << 20, false},
		{"case matters", `{"MODEL":"x"}`, "model", "", 1 << 20, false},
		{"absent", `{"x":"y"}`, "model", "", 1 << 20, false},
		{"empty string", `{"model":""}`, "model", "", 1 << 20, false},
		{"an object", `{"model":{"a":1}}`, "model", "", 1 << 20, false},
		{"null", `{"model":null}`, "model", "", 1 << 20, false},
		{"not json", `model=gpt-4o`, "model", "", 1 << 20, false},
		{"an array", `["model","x"]`, "model", "", 1 << 20, false},
		{"cut", `{"model":"gpt-4o"`, "model", "", 1 << 20, false},
		{"beyond the bound", long + `"model":"gpt-4o"}`, "model", "", 100 << 10, false},
		{"many colons", colons + `"model":"gpt-4o"}`, "model", "gpt-4o", 1 << 20, true},
		{"many colons, last duplicate wins", colons + `"model":"mini","model":"gpt-4o"}`, "model", "gpt-4o", 1 << 20, true},
		{"many colons, a number", colons + `"model":-12.5}`, "model", "-12.5", 1 << 20, true},
		{"many colons, nested", colons + `"a":{"x":1,"b":"v"}}`, "a.b", "v", 1 << 20, true},
		{"many colons, absent", colons + `"x":"y"}`, "model", "", 1 << 20, false},
		{"many colons, cut", colons + `"model":"gpt-4o"`, "model", "", 1 << 20, false},
		{"many colons, trailing data", colons + `"model":"gpt-4o"} x`, "model", "", 1 << 20, false},
		{"spaces", " {\n \"model\" :\t\"gpt-4o\" , \"n\" : 12 }\n", "model", "gpt-4o", 1 << 20, true},
		{"many colons, spaces", colons + " \"model\" :\t\"gpt-4o\" , \"n\" : 12 }\n", "model", "gpt-4o", 1 << 20, true},
		{"many colons, a number and spaces", colons + " \"model\" :\t12 , \"n\" : 12 }\n", "model", "12", 1 << 20, true},
		{"trailing data", `{"model":"gpt-4o"} x`, "model", "", 1 << 20, false},
		{"object not closed within the bound", `{"model":"gpt-4o","messages":"` + strings.Repeat("x", 100) + `"}`, "model", "", 50, false},
	}

	for _, c := range cases {
		for _, chunked := range []bool{false, true} {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(c.body))
			if chunked {
				req.Body = io.NopCloser(strings.NewReader(c.body))
				req.ContentLength = -1
			}
			v, ok := BodyValue(req, strings.Split(c.path, "."), c.max)
			if v != c.want || ok != c.ok {
				t.Errorf("%s (chunked %v): got %q, %v; want %q, %v", c.name, chunked, v, ok, c.want, c.ok)
			}
			got, _ := io.ReadAll(req.Body)
			if !bytes.Equal(got, []byte(c.body)) {
				t.Errorf("%s (chunked %v): the body read back differs (%d bytes, want %d)", c.name, chunked, len(got), len(c.body))
			}
		}
	}
}

func TestBodyValueReadsNothingOfABodyLongerThanItsBound(t *testing.T) {
	body := &countingReader{r: strings.NewReader(`{"model":"gpt-4o"}`)}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Body = io.NopCloser(body)
	req.ContentLength = 1 << 30

	if _, ok := BodyValue(req, []string{"model"}, 8<<20); ok || body.n != 0 {
		t.Fatalf("read %d bytes of a body announced above the bound (ok %v)", body.n, ok)
	}
}

func TestBodyValueLooksAtABoundedNumberOfMembers(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < MaxBodyMembers; i++ {
		b.WriteString(`"a":0,`)
	}
	b.WriteString(`"model":"x"}`)
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(b.String()))

	if v, ok := BodyValue(req, []string{"model"}, 8<<20); ok {
		t.Fatalf("read %q past %d members", v, MaxBodyMembers)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
