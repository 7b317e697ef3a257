package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/limit"

	"github.com/tierlimit/tierlimit/config"
)

// A layer's calendar (README: calendar, utcOffset) replaces its duration
// with fixed windows aligned to the calendar: days from 00:00, weeks from
// Monday 00:00, months from the 1st, in UTC or at a fixed offset. Such a
// layer is served on the general path (chooseMode). In memory a window
// starts at its period's start and resets at the next boundary
// (alignCalendar); in Redis its key names the period's start in Unix
// seconds, so every replica counts in the same key and an old period's key
// expires, and the window sent to the script is what is left of the period
// (calendarCall).
const (
	calDay   = config.CalDay
	calWeek  = config.CalWeek
	calMonth = config.CalMonth
)

// A month layer's RateLimit-Policy w is the current month's length, where
// every other layer's is a constant of its header table. All the keys of a
// calendar layer share one period, so the value changes only at the
// layer's month boundary: monthPolicy keeps it for the period it was made
// for. The shared request path pays nothing for it (doc.go: frames):
// an instance with a month layer takes its store through monthStore, which
// marks the tally when a month layer is shown (monthPolicyBit in
// tally.firsts), and verdict, whose report branch runs after the headers
// are set, corrects the header there (reportTally).

// monthPolicyBit marks, in tally.firsts, a tally that shows a month layer;
// the lower bits are the layers' first refusals (report reads those only).
const monthPolicyBit = uint64(1) << 63

// anyMonth reports whether one of the layers has calendar: month.
func anyMonth(layers []*layer) bool {
	for _, l := range layers {
		if l.Calendar == calMonth {
			return true
		}
	}

	return false
}

// monthStore is the store of an instance with a month layer: it marks
// the tallies that show one (monthPolicyBit).
type monthStore struct {
	inner counterStore
}

func (m *monthStore) Take(t *tally, c *charge) {
	m.inner.Take(t, c)

	if t.Shown >= 0 && c.Layers[t.Shown].Month != nil {
		t.Firsts |= monthPolicyBit
	}
}

func (m *monthStore) Refund(c *charge, cost int64) {
	m.inner.Refund(c, cost)
}

// setMonthPolicy writes month layer l's RateLimit-Policy for the month that
// holds now, when h shows l's header table (headers on, l shown).
func setMonthPolicy(h http.Header, l *layer, now int64) {
	v := h["Ratelimit-Policy"]
	if len(v) != 1 || v[0] != l.PolicyHdr[0] {
		return
	}

	h["Ratelimit-Policy"] = monthPolicyAt(l, now)
}

// monthPolicyAt is l's RateLimit-Policy value at now, made again when now
// leaves the period it was made for.
func monthPolicyAt(l *layer, now int64) []string {
	m := l.Month

	m.Mu.Lock()
	defer m.Mu.Unlock()

	if m.Hdr == nil || now < m.Start || now >= m.End {
		start, end := limit.Period(now, l.Calendar, l.UtcOffset)
		m.Start = start
		m.End = end
		m.Hdr = []string{`"` + l.Name + `";q=` + l.Limit + ";w=" + formatInt(limit.CeilSeconds(end-start))}
	}

	return m.Hdr
}

// monthPolicyOf is setMonthPolicy where the headers were set for l without
// a tally's mark (the ip charge of an invalid credential, invalidcred.go).
func monthPolicyOf(h http.Header, l *layer, now int64) {
	if l.Month != nil {
		setMonthPolicy(h, l, now)
	}
}
