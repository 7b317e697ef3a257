package config

import (
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/usage"
)

// parseRouteMeter reads a route's costFrom and reserve (default 1). The
// reserve is what the route's own layer holds for a request in flight, so it
// must fit the layer (its points, a token bucket's burst) and each of the
// route's plans, or no request could be admitted. A route that counts
// statuses (countStatus) already charges after the response, and a route
// that is off charges nothing: costFrom on either is an error, as is a
// reserve without costFrom, which would hold nothing.
func parseRouteMeter(field string, rc RouteConfig, spec *Route) error {
	if rc.CostFrom == "" {
		if rc.Reserve != 0 {
			return invalid(field+".reserve", rc.Reserve, "takes costFrom: a route without it charges its cost up front")
		}

		return nil
	}

	src, err := usage.ParseExpr(rc.CostFrom)
	if err != nil {
		// An expression of one term is named once; a term of a sum by itself.
		why := err.Error()
		if whole := "costFrom " + strconv.Quote(rc.CostFrom) + ": "; strings.HasPrefix(why, whole) {
			why = why[len(whole):]
		} else {
			why = "the term " + strings.TrimPrefix(why, "costFrom ")
		}

		return invalid(field+".costFrom", rc.CostFrom, why)
	}

	switch {
	case !spec.On():
		return invalid(field+".costFrom", rc.CostFrom, "is ignored on a route with points 0 (off), which charges nothing")
	case spec.CountStatus != nil:
		return invalid(field+".costFrom", rc.CostFrom, "cannot be combined with countStatus: both charge the route after the response")
	case rc.Reserve < 0:
		return invalid(field+".reserve", rc.Reserve, "must be >= 1 (0: 1)")
	}

	spec.CostFrom = &src
	spec.Reserve = RequestCost
	if rc.Reserve > 0 {
		spec.Reserve = int64(rc.Reserve)
	}

	for _, r := range append([]Rule{spec.Rule}, spec.Plans...) {
		capacity := limit.Capacity(r.Algorithm, r.Points, r.Burst)

		if r.On() && spec.Reserve > capacity {
			return invalid(field+".reserve", spec.Reserve, "must be at most what "+r.Name+" holds (its points, a token bucket's burst): "+strconv.FormatInt(capacity, 10))
		}
	}

	return nil
}
