package usage

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// An expression (Expr) other than one json: path alone is read from the
// same bytes as a path is (Feed), and decoded at the end of the body or of
// each event: each json: term keeps the value of the last event that states
// it, each llm: field too (llm.go), so that an event stating some fields
// only (Anthropic's message_delta, its output) keeps the others. Its cost is
// the sum of its terms' values times their weights, in thousandths, rounded
// up to a whole point; a term whose source states nothing counts 0, and an
// expression none of whose sources states anything states no cost.

// maxSum bounds an expression's sum, in thousandths: its cost stays below
// 10^18 (doc.go: costs), however large its values and weights.
const maxSum = int64(1) << 60

// finishOther is finish for a Reader other than one json: path read as it
// comes (Reader.mode, Reader.expr).
func finishOther(r *Reader) {
	switch r.mode {
	case modeCompressed:
		endInflate(r)
		inner, _ := r.inner.(*Reader)
		cost, ok := Result(inner)
		r.cost = cost
		r.ok = ok

		return
	case modePlain:
		if r.stream {
			endEvent(r)
		} else if !r.over {
			readTerms(r, r.buf)
		}
	}

	r.buf = nil

	if r.expr != nil {
		cost, ok := evaluate(r)
		r.cost = cost
		r.ok = ok
	}
}

// eventTerms reads the data of an event of a stream for an expression, and
// makes what it states so far the stream's cost (Stated).
func eventTerms(r *Reader) {
	if !mayState(r.expr, r.buf) {
		return
	}

	readTerms(r, r.buf)

	cost, ok := evaluate(r)
	if ok {
		r.cost = cost
		r.ok = true
	}
}

// mayState reports whether data may state some term of e: it holds one of
// e's needles or a \u escape that could write one.
func mayState(e *Expr, data []byte) bool {
	if e.needles == nil || bytes.Contains(data, unicodeEscape) {
		return true
	}

	for _, n := range e.needles {
		if bytes.Contains(data, n) {
			return true
		}
	}

	return false
}

// readTerms reads what the JSON value data states of r's expression's
// terms: the values at its json: paths, and the llm: fields.
func readTerms(r *Reader, data []byte) {
	for i, t := range r.expr.Terms {
		if len(t.Source.Path) == 0 {
			continue
		}

		if v, ok := lookup(data, t.Source.Path); ok {
			r.vals[i] = v
			r.stated |= uint32(1) << uint(i)
		}
	}

	if r.expr.llm {
		readUsage(r, data)
	}
}

// evaluate is the cost r's expression states: false when none of its
// sources states anything.
func evaluate(r *Reader) (int64, bool) {
	sum := int64(0)
	any := false

	for i, t := range r.expr.Terms {
		v, ok := termValue(r, i, t.Source)
		if !ok {
			continue
		}

		any = true
		sum = addCapped(sum, mulCapped(v, t.Weight))
	}

	if !any {
		return 0, false
	}

	return (sum + 999) / 1000, true
}

// termValue is what term i of r's expression, whose source is src, states.
func termValue(r *Reader, i int, src Source) (int64, bool) {
	switch {
	case src.Header != "":
		return HeaderCost(r.header, src.Header)
	case src.LLM != llmNone:
		return llmValue(r, src.LLM), r.set != 0
	}

	return r.vals[i], r.stated&(uint32(1)<<uint(i)) != 0
}

// HeaderCost is the cost header name (canonical) states in h, else its
// trailer: several copies are a list (ParseHeaderValues). The common case,
// one copy, in a small frame, the others in headerCostElse's (../doc.go:
// frames).
func HeaderCost(h http.Header, name string) (int64, bool) {
	if v := h[name]; len(v) == 1 {
		return ParseHeaderValue(v[0])
	}

	return headerCostElse(h, name)
}

func headerCostElse(h http.Header, name string) (int64, bool) {
	v := h[name]
	if len(v) == 0 {
		v = h[http.TrailerPrefix+name]
	}

	if len(v) == 0 {
		return 0, false
	}

	return ParseHeaderValues(v)
}

func mulCapped(v, weight int64) int64 {
	if weight != 0 && v > maxSum/weight {
		return maxSum
	}

	return v * weight
}

func addCapped(a, b int64) int64 {
	if a > maxSum-b {
		return maxSum
	}

	return a + b
}

// readUsage reads the llm: fields that the JSON value data states: an
// object, or an array of them (Gemini's streamGenerateContent without
// alt=sse), each read in turn.
func readUsage(r *Reader, data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		usageOfObject(r, data)
		return
	}

	var items []json.RawMessage
	if json.Unmarshal(data, &items) != nil {
		return
	}

	for _, item := range items {
		usageOfObject(r, item)
	}
}
