package limit

import "time"

// Calendar periods (config: calendar): a layer's fixed windows aligned to
// days from 00:00, weeks from Monday 00:00 or months from the 1st.
const (
	Day = 1 + iota
	Week
	Month
)

// Period returns the start and the end (the next boundary) of the calendar
// period that holds now, at utcOffset nanoseconds east of UTC.
func Period(now int64, calendar int, utcOffset int64) (start, end int64) {
	t := time.Unix(0, now+utcOffset).UTC()
	y, m, d := t.Date()

	var from, to time.Time

	switch calendar {
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		from = time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 0, 7)
	case Month:
		from = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 1, 0)
	default:
		from = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 0, 1)
	}

	return from.UnixNano() - utcOffset, to.UnixNano() - utcOffset
}

// CeilSeconds converts nanoseconds to whole seconds, rounding up: a client
// that waits until then finds a new window.
func CeilSeconds(ns int64) int64 {
	if ns <= 0 {
		return ns / int64(time.Second)
	}

	return (ns + int64(time.Second) - 1) / int64(time.Second)
}
