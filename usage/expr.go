package usage

import (
	"strconv"
	"strings"
)

// Expr is a costFrom: a sum of terms, each a source times a weight
// ("llm:input + 4*llm:output"). ParseExpr makes one.
type Expr struct {
	Terms []Term
	// Spec is the expression as written, which events and the status page
	// name.
	Spec string
	// Header is the header of an expression that is one header: source of
	// weight 1, read as a header alone (meter.go in the root); "" otherwise.
	Header string
	// path is the path of an expression that is one json: source of weight
	// 1, which a Reader reads as it did before sums (reader.go); nil
	// otherwise.
	path []string
	// quoted is that path's last segment in quotes (Reader.quoted).
	quoted []byte
	// llm: some term is an llm: variable.
	llm bool
	// needles are what an event's data holds somewhere when it may state a
	// term (the quoted last segments of the json: paths, `"usage` for the
	// llm: variables): an event that holds none of them, nor a \u escape,
	// is skipped unparsed. nil: every event is parsed.
	needles [][]byte
}

// Term is a source times a weight, in thousandths (1000: weight 1).
type Term struct {
	Weight int64
	Source Source
}

// The bounds of an expression.
const (
	// MaxTerms is the most terms an expression holds.
	MaxTerms = 16
	// MaxWeight is the largest weight, in thousandths: 1,000,000.
	MaxWeight = 1000000 * 1000
)

const prefixLLM = "llm:"

// The llm: variables (Source.LLM).
const (
	llmNone = iota
	llmInput
	llmOutput
	llmCachedInput
	llmTotal
)

var llmNames = map[string]int{"input": llmInput, "output": llmOutput, "cachedInput": llmCachedInput, "total": llmTotal}

// ParseExpr reads a costFrom: terms "[weight*]source" joined by "+",
// spaces around either allowed. A source is "llm:input", "llm:output",
// "llm:cachedInput", "llm:total", "json:<dotted.path>" or "header:<Name>"
// (ParseSource); a weight a non-negative decimal with at most three
// decimal places, at most 1,000,000 (1 if omitted). So a path or a header
// name of an expression holds no "+" and no "*". Its errors wrap ErrSource
// and name the term: costFrom "<term>": <what is wrong>.
func ParseExpr(spec string) (Expr, error) {
	e := Expr{Spec: spec}

	parts := strings.Split(spec, "+")
	if len(parts) > MaxTerms {
		return Expr{}, sourceError(spec, "more than "+strconv.Itoa(MaxTerms)+" terms")
	}

	for _, part := range parts {
		term, err := parseTerm(strings.TrimSpace(part))
		if err != nil {
			return Expr{}, err
		}

		e.Terms = append(e.Terms, term)
	}

	if len(e.Terms) == 1 && e.Terms[0].Weight == 1000 {
		e.Header = e.Terms[0].Source.Header
		e.path = e.Terms[0].Source.Path
	}

	e.needles = needlesOf(e.Terms)
	if e.path != nil && e.needles != nil {
		e.quoted = e.needles[0]
	}

	for _, t := range e.Terms {
		if t.Source.LLM != llmNone {
			e.llm = true
		}
	}

	return e, nil
}

// parseTerm reads one term of an expression, trimmed.
func parseTerm(s string) (Term, error) {
	if s == "" {
		return Term{}, sourceError(s, "an empty term")
	}

	t := Term{Weight: 1000}
	src := s

	if i := strings.IndexByte(s, '*'); i >= 0 {
		w, ok := parseWeight(strings.TrimSpace(s[:i]))
		if !ok {
			return Term{}, sourceError(s, "the weight "+strconv.Quote(strings.TrimSpace(s[:i]))+" is not a non-negative decimal with at most three decimal places, at most 1000000")
		}

		t.Weight = w
		src = strings.TrimSpace(s[i+1:])
	}

	if strings.HasPrefix(src, prefixLLM) {
		v, ok := llmNames[src[len(prefixLLM):]]
		if !ok {
			return Term{}, sourceError(s, "unknown source: llm:input, llm:output, llm:cachedInput or llm:total")
		}

		t.Source = Source{LLM: v, Spec: src}

		return t, nil
	}

	if !strings.HasPrefix(src, prefixHeader) && !strings.HasPrefix(src, prefixJSON) {
		return Term{}, sourceError(s, `unknown source: must start with "llm:", "json:" or "header:"`)
	}

	parsed, err := ParseSource(src)
	if err != nil {
		return Term{}, err
	}

	if strings.ContainsRune(src, '*') {
		return Term{}, sourceError(s, `a term holds at most one "*"`)
	}

	t.Source = parsed

	return t, nil
}

// parseWeight reads a weight in thousandths: digits, optionally a point
// and one to three digits.
func parseWeight(s string) (int64, bool) {
	whole, frac := s, ""
	if i := strings.IndexByte(s, '.'); i >= 0 {
		whole = s[:i]
		frac = s[i+1:]

		if frac == "" || len(frac) > 3 {
			return 0, false
		}
	}

	if whole == "" || len(whole) > 7 || digitsEnd(whole, 0) != len(whole) || digitsEnd(frac, 0) != len(frac) {
		return 0, false
	}

	w, err := strconv.ParseInt(whole+(frac + "000")[:3], 10, 64)
	if err != nil || w > MaxWeight {
		return 0, false
	}

	return w, true
}

// needlesOf returns Expr.needles for terms.
func needlesOf(terms []Term) [][]byte {
	var out [][]byte

	for _, t := range terms {
		switch {
		case t.Source.LLM != llmNone:
			out = append(out, []byte(`"usage`))
		case len(t.Source.Path) > 0:
			last := t.Source.Path[len(t.Source.Path)-1]
			if strings.ContainsAny(last, "/\"\\\uFFFD") {
				// JSON may write it otherwise (NewReader: quoted).
				return nil
			}

			out = append(out, []byte(`"`+last+`"`))
		}
	}

	return out
}
