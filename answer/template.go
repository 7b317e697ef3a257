package answer

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/limit"
)

// A refusal body template (response.body) is text with placeholders:
// {limit}, {remaining}, {reset} (RFC 3339), {resetUnix}, {retryAfter} and
// {layer}. Single braces, because Traefik's file provider reads {{ }} as its
// own template syntax; a JSON body's braces are left alone since only a brace,
// letters and a brace form a placeholder.
const (
	phText = iota
	phLimit
	phRemaining
	phReset
	phResetUnix
	phRetryAfter
	phLayer
)

var placeholders = map[string]int{
	"limit": phLimit, "remaining": phRemaining, "reset": phReset,
	"resetUnix": phResetUnix, "retryAfter": phRetryAfter, "layer": phLayer,
}

// BodyPart is literal text (kind phText) or a placeholder.
type BodyPart struct {
	kind int
	text string
}

// ParseBodyTemplate splits a template into parts. A brace-letters-brace group
// that is not a known placeholder is an error, so that a typo does not reach
// clients as literal text.
func ParseBodyTemplate(tmpl string) ([]BodyPart, error) {
	var parts []BodyPart

	text := 0

	for i := 0; i < len(tmpl); i++ {
		if tmpl[i] != '{' {
			continue
		}

		j := i + 1
		for j < len(tmpl) && (tmpl[j] >= 'a' && tmpl[j] <= 'z' || tmpl[j] >= 'A' && tmpl[j] <= 'Z') {
			j++
		}

		if j == i+1 || j >= len(tmpl) || tmpl[j] != '}' {
			continue
		}

		kind, ok := placeholders[tmpl[i+1:j]]
		if !ok {
			return nil, errors.New("unknown placeholder " + tmpl[i:j+1] +
				" (known: {limit}, {remaining}, {reset}, {resetUnix}, {retryAfter}, {layer})")
		}

		if i > text {
			parts = append(parts, BodyPart{kind: phText, text: tmpl[text:i]})
		}

		parts = append(parts, BodyPart{kind: kind})
		text = j + 1
		i = j
	}

	if text < len(tmpl) {
		parts = append(parts, BodyPart{kind: phText, text: tmpl[text:]})
	}

	return parts, nil
}

// BindLayer fills the placeholders that a layer fixes (its name, its limit, and
// the remaining count, which is 0 in every refusal) and joins adjacent text.
func BindLayer(parts []BodyPart, name, limit string) []BodyPart {
	var out []BodyPart

	for _, part := range parts {
		switch part.kind {
		case phLimit:
			part = BodyPart{kind: phText, text: limit}
		case phLayer:
			part = BodyPart{kind: phText, text: name}
		case phRemaining:
			part = BodyPart{kind: phText, text: "0"}
		}

		if part.kind == phText && len(out) > 0 && out[len(out)-1].kind == phText {
			out[len(out)-1].text += part.text
			continue
		}

		out = append(out, part)
	}

	if out == nil {
		out = []BodyPart{{kind: phText}}
	}

	return out
}

// render fills the per-refusal placeholders. reset and now are Unix nanoseconds.
func render(parts []BodyPart, reset, now int64) string {
	var b strings.Builder

	for _, part := range parts {
		switch part.kind {
		case phText:
			b.WriteString(part.text)
		case phReset:
			b.WriteString(time.Unix(limit.CeilSeconds(reset), 0).UTC().Format(time.RFC3339))
		case phResetUnix:
			b.WriteString(strconv.FormatInt(limit.CeilSeconds(reset), 10))
		case phRetryAfter:
			b.WriteString(RetryAfter(reset, now))
		}
	}

	return b.String()
}
