package rule

import (
	"net/http"
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
)

// A month layer's RateLimit-Policy w is the current month's length, where
// every other layer's is a constant of its header table. All the keys of a
// calendar layer share one period, so the value changes only at the
// layer's month boundary: the layer's MonthPolicy keeps it for the period
// it was made for. The shared request path pays nothing for it (../doc.go:
// frames): in an instance with a month layer, the root's take marks the
// tally when a month layer is shown (MonthPolicyBit in Tally.Firsts), and
// the root's verdict, whose report branch runs after the headers are set,
// corrects the header there (SetMonthPolicy).

// MonthPolicyBit marks, in Tally.Firsts, a tally that shows a month layer;
// the lower bits are the layers' first refusals (the root's report reads
// those only).
const MonthPolicyBit = uint64(1) << 63

// AnyMonth reports whether one of the layers has calendar: month.
func AnyMonth(layers []*Layer) bool {
	for _, l := range layers {
		if l.Calendar == limit.Month {
			return true
		}
	}

	return false
}

// SetMonthPolicy writes month layer l's RateLimit-Policy for the month that
// holds now, when h shows l's header table (headers on, l shown).
func SetMonthPolicy(h http.Header, l *Layer, now int64) {
	v := h["Ratelimit-Policy"]
	if len(v) != 1 || v[0] != l.PolicyHdr[0] {
		return
	}

	h["Ratelimit-Policy"] = MonthPolicyAt(l, now)
}

// MonthPolicyAt is l's RateLimit-Policy value at now, made again when now
// leaves the period it was made for.
func MonthPolicyAt(l *Layer, now int64) []string {
	m := l.Month

	m.Mu.Lock()
	defer m.Mu.Unlock()

	if m.Hdr == nil || now < m.Start || now >= m.End {
		start, end := limit.Period(now, l.Calendar, l.UtcOffset)
		m.Start = start
		m.End = end
		m.Hdr = []string{`"` + l.Name + `";q=` + l.Limit + ";w=" + strconv.FormatInt(limit.CeilSeconds(end-start), 10)}
	}

	return m.Hdr
}

// MonthPolicyOf is SetMonthPolicy where the headers were set for l without
// a tally's mark (the ip charge of an invalid credential, ../after.go).
func MonthPolicyOf(h http.Header, l *Layer, now int64) {
	if l.Month != nil {
		SetMonthPolicy(h, l, now)
	}
}

// SetMonthItems writes anew the RateLimit-Policy of a tally t with items
// (Tally.Each, ../items.go) for an instance with a calendar month layer:
// each item from its layer's policy, a month layer's of the current month,
// the shown layer first.
func SetMonthItems(h http.Header, t *Tally, c *Charge) {
	policy := ""
	for i, l := range c.Layers {
		if i != t.Shown && (t.Each[2*i] == 0 || l.Quiet) {
			continue
		}

		item := l.PolicyHdr[0]
		if l.Month != nil {
			item = MonthPolicyAt(l, c.Now)[0]
		}

		if i == t.Shown {
			policy = item + policy
		} else {
			policy += ", " + item
		}
	}

	h["Ratelimit-Policy"] = []string{policy}
}
