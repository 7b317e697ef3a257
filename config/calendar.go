package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/limit"
)

// A layer's calendar (README: calendar, utcOffset) replaces its duration
// with fixed windows aligned to the calendar: days from 00:00, weeks from
// Monday 00:00, months from the 1st, in UTC or at a fixed offset (the root's
// memstore and redisstore count them).
const (
	CalDay   = limit.Day
	CalWeek  = limit.Week
	CalMonth = limit.Month
)

// calendarMax is the longest period of each calendar: the layer's duration,
// which sizes its Redis TTL bound and its memory list.
var calendarMax = map[int]time.Duration{CalDay: 24 * time.Hour, CalWeek: 7 * 24 * time.Hour, CalMonth: 31 * 24 * time.Hour}

// parseWindow reads a layer's duration, or its calendar and utcOffset; a
// calendar with a duration is an error.
func parseWindow(field string, lc LayerConfig, spec *Rule) error {
	cal := strings.TrimSpace(lc.Calendar)
	if cal == "" {
		if strings.TrimSpace(lc.UtcOffset) != "" {
			return invalid(field+".utcOffset", lc.UtcOffset, "takes a calendar: day, week or month")
		}

		d, err := ParseDuration(lc.Duration)
		if err != nil {
			return invalid(field+".duration", durationText(lc.Duration), err.Error())
		}

		spec.Duration = d

		return nil
	}

	switch cal {
	case "day":
		spec.Calendar = CalDay
	case "week":
		spec.Calendar = CalWeek
	case "month":
		spec.Calendar = CalMonth
	default:
		return invalid(field+".calendar", lc.Calendar, `must be "day", "week" or "month"`)
	}

	if strings.TrimSpace(lc.Duration) != "" {
		return invalid(field+".duration", durationText(lc.Duration), "cannot be set together with "+field+".calendar ("+cal+"), whose period is the window")
	}

	offset, err := parseUtcOffset(lc.UtcOffset)
	if err != nil {
		return invalid(field+".utcOffset", lc.UtcOffset, err.Error())
	}

	spec.UtcOffset = offset
	spec.Duration = calendarMax[spec.Calendar]

	return nil
}

// parseUtcOffset reads "+07:00", "-03:30" or "Z" (empty: UTC), in nanoseconds.
func parseUtcOffset(raw string) (int64, error) {
	v := strings.TrimSpace(raw)
	if v == "" || v == "Z" {
		return 0, nil
	}

	bad := errorString(`must be a fixed offset such as "+07:00" or "-03:30", from -12:00 to +14:00`)
	if len(v) != 6 || v[0] != '+' && v[0] != '-' || v[3] != ':' {
		return 0, bad
	}

	h, err1 := strconv.Atoi(v[1:3])
	m, err2 := strconv.Atoi(v[4:6])

	if err1 != nil || err2 != nil || m > 59 || v[1] == '+' || v[4] == '+' {
		return 0, bad
	}

	offset := int64(h)*int64(time.Hour) + int64(m)*int64(time.Minute)
	if v[0] == '-' {
		offset = -offset
	}

	if offset < -12*int64(time.Hour) || offset > 14*int64(time.Hour) {
		return 0, bad
	}

	return offset, nil
}

type errorString string

func (e errorString) Error() string { return string(e) }
