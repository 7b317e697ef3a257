package usage

import (
	"strings"
	"testing"
)

// feedBounded feeds body in chunks of 4 KiB and fails as soon as the
// Reader's buffer holds, or has room for, more than limit bytes.
func feedBounded(t *testing.T, name, contentType, body string, limit int) (int64, bool) {
	t.Helper()

	src, _ := ParseSource("json:usage.total_tokens")
	r := NewReader(src, contentType)
	largest := 0

	for i := 0; i < len(body); i += 4096 {
		j := i + 4096
		if j > len(body) {
			j = len(body)
		}

		Feed(r, []byte(body[i:j]))

		if cap(r.buf) > largest {
			largest = cap(r.buf)
		}

		if cap(r.buf) > limit {
			t.Fatalf("%s: after %d bytes the buffer has a capacity of %d, above %d", name, j, cap(r.buf), limit)
		}
	}

	t.Logf("%s: %d bytes read, the buffer's capacity at most %d", name, len(body), largest)

	got, ok := Result(r)
	if r.buf != nil {
		t.Errorf("%s: Result kept a buffer of %d bytes", name, cap(r.buf))
	}

	return got, ok
}

// TestMemoryBounds feeds 10 MiB bodies in 4 KiB chunks: the Reader's buffer
// never grows past its bound (doc.go: memory).
func TestMemoryBounds(t *testing.T) {
	const size = 10 << 20

	usage := `,"usage":{"total_tokens":400}}`
	jsonBody := `{"pad":"` + strings.Repeat("x", size) + `"` + usage

	if _, ok := feedBounded(t, "a 10 MiB JSON body", "application/json", jsonBody, MaxJSONBody); ok {
		t.Error("a JSON body over the bound stated a cost")
	}

	// Just below the bound, with a capacity at the bound.
	fits := `{"pad":"` + strings.Repeat("x", MaxJSONBody-len(usage)-len(`{"pad":""`)) + `"` + usage
	if got, ok := feedBounded(t, "a JSON body of MaxJSONBody bytes", "application/json", fits, MaxJSONBody); !ok || got != 400 {
		t.Errorf("a JSON body at the bound: %d, %v, want 400, true", got, ok)
	}

	event := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("y", 200) + "\"}}],\"usage\":null}\n\n"
	last := "data: {\"usage\":{\"total_tokens\":400}}\n\ndata: [DONE]\n\n"

	for _, c := range []struct {
		name, body string
		ok         bool
	}{
		{"10 MiB of small events", strings.Repeat(event, size/len(event)) + last, true},
		{"a 10 MiB event", "data: {\"usage\":{\"total_tokens\":9},\"pad\":\"" + strings.Repeat("z", size) + "\"}\n\n", false},
		{"a 10 MiB event, then a valid one", "data: " + strings.Repeat("z", size) + "\n\n" + last, true},
		{"10 MiB of data lines in one event", strings.Repeat("data: "+strings.Repeat("w", 1000)+"\n", size/1007) + "\n" + last, true},
		{"a 10 MiB comment line", ":" + strings.Repeat("c", size) + "\n" + last, true},
		{"a 10 MiB line of another field", "event: " + strings.Repeat("e", size) + "\n" + last, true},
		{"10 MiB of empty lines", strings.Repeat("\r\n", size/2) + last, true},
	} {
		got, ok := feedBounded(t, c.name, eventStream, c.body, MaxEventBytes)
		if ok != c.ok || (ok && got != 400) {
			t.Errorf("%s: %d, %v, want ok %v", c.name, got, ok, c.ok)
		}
	}
}
