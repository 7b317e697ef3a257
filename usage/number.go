package usage

import (
	"strconv"
	"strings"
)

// The bounds of a cost as a response states it.
const (
	// maxCost bounds a cost: it is below 10^18.
	maxCost = 1000000000000000000
	// maxDigits is the most significant digits of a cost: every cost is
	// below 10^18, so it fits an int64 with room to add it to a count.
	maxDigits = 18
	// maxNumberBytes is the longest number read, in bytes, spaces trimmed.
	maxNumberBytes = 64
	// maxExponent caps an exponent as it is read: with at most
	// maxNumberBytes digits, any larger one decides nothing more.
	maxExponent = 1000
)

// ParseHeaderValue reads a cost from a header or trailer value: a
// non-negative number with an integral value below 10^18 (at most 18
// significant digits), spaces and tabs around it allowed. The number is
// written as JSON writes numbers (an integer, an optional fraction, an
// optional exponent) so that "400", "400.0", "4e2" and "4.00E+2" are all
// 400; unlike JSON, leading zeros ("0400") are accepted. A list of them
// ("4, 5") is read as ParseHeaderValues reads one: its largest. Anything
// else is refused (false): empty, more than 64 bytes once trimmed, a sign
// ("+4", "-4", "-0"), a fraction ("400.5", "4e-1"), "400." or ".5", text,
// 10^18 or more.
//
// A JSON body's value goes through it too, so that both forms of a source
// agree (a JSON value is never a list: a comma is not in any number).
func ParseHeaderValue(v string) (int64, bool) {
	s := strings.Trim(v, " \t")

	// The common case, digits alone, in one call of compiled code: ParseUint
	// takes digits alone (no sign, no underscore in base 10), leading zeros
	// included.
	if n, err := strconv.ParseUint(s, 10, 64); err == nil && n < maxCost && len(s) <= maxNumberBytes {
		return int64(n), true
	}

	return parseOther(s)
}

// parseOther reads a value of ParseHeaderValue that is not digits alone: a
// number in another form, or a list of them (ParseHeaderValues).
func parseOther(s string) (int64, bool) {
	if strings.IndexByte(s, ',') >= 0 {
		return parseList([]string{s})
	}

	return parseCost(s)
}

// ParseHeaderValues reads a cost from the values of a header or trailer
// (one per copy of the field, as http.Header holds them) as HTTP reads a
// list: the copies and their comma-separated members are one list (a proxy
// may fold copies into one line), empty members are skipped. Each member
// must be a cost that ParseHeaderValue reads alone; the cost stated is the
// largest of them, so that a backend, or a middleware after it, that
// repeats the field cannot state less than one of its values. Any other
// member states no cost (false), as does a list with no member.
// ParseHeaderValue reads a single copy so too.
func ParseHeaderValues(v []string) (int64, bool) {
	if len(v) == 1 {
		return ParseHeaderValue(v[0])
	}

	return parseList(v)
}

// parseList is ParseHeaderValues for what is not one value alone.
func parseList(v []string) (int64, bool) {
	largest, ok := int64(0), false

	for _, line := range v {
		for _, member := range strings.Split(line, ",") {
			if strings.Trim(member, " \t") == "" {
				continue
			}

			n, valid := parseCost(strings.Trim(member, " \t"))
			if !valid {
				return 0, false
			}

			if !ok || n > largest {
				largest = n
				ok = true
			}
		}
	}

	return largest, ok
}

// parseCost reads the number of ParseHeaderValue, trimmed, when it is not
// digits alone.
func parseCost(s string) (int64, bool) {
	if len(s) > maxNumberBytes {
		return 0, false
	}

	i := digitsEnd(s, 0)
	if i == 0 {
		return 0, false
	}

	digits := s[:i]
	fraction := ""

	if i < len(s) && s[i] == '.' {
		j := digitsEnd(s, i+1)
		if j == i+1 {
			return 0, false
		}

		fraction = s[i+1 : j]
		i = j
	}

	exp := 0

	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		e, ok := parseExponent(s[i+1:])
		if !ok {
			return 0, false
		}

		exp = e
		i = len(s)
	}

	if i != len(s) {
		return 0, false
	}

	return integral(digits+fraction, exp-len(fraction))
}

// digitsEnd returns the index of the first byte of s at or after i that is
// not an ASCII digit.
func digitsEnd(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}

	return i
}

// parseExponent reads an exponent's optional sign and its digits (all of s),
// capped at maxExponent either way.
func parseExponent(s string) (int, bool) {
	sign := 1

	if s != "" && (s[0] == '+' || s[0] == '-') {
		if s[0] == '-' {
			sign = -1
		}

		s = s[1:]
	}

	if s == "" || digitsEnd(s, 0) != len(s) {
		return 0, false
	}

	e := 0

	for i := 0; i < len(s) && e < maxExponent; i++ {
		e = e*10 + int(s[i]-'0')
	}

	return sign * e, true
}

// integral returns digits x 10^exp when it is a whole number below 10^18.
func integral(digits string, exp int) (int64, bool) {
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return 0, true
	}

	if exp < 0 {
		// digits starts with a non-zero digit: with all of it after the
		// point, the value lies strictly between 0 and 1.
		if -exp >= len(digits) {
			return 0, false
		}

		cut := len(digits) + exp
		if strings.TrimLeft(digits[cut:], "0") != "" {
			return 0, false
		}

		digits = digits[:cut]
		exp = 0
	}

	if len(digits)+exp > maxDigits {
		return 0, false
	}

	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, false
	}

	for ; exp > 0; exp-- {
		n *= 10
	}

	return n, true
}
