package config

import (
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/limit"
)

// A concurrency layer (algorithm: concurrency) counts requests in flight:
// points of them at once per key, each slot held from the request's admission
// until its response ends, at most duration (the lease), after which a slot
// that a dead replica or a hung request holds is free again. What cannot
// combine with it is an error naming the field, never ignored:
//   - calendar, blockDuration: a slot is freed by its request ending, not by
//     a window, and a refusal lasts as long as the slots are busy;
//   - a route's cost above 1 on a concurrency route (or one of its plans):
//     a request holds one slot whatever it costs (a concurrency layer among
//     the layers a costly route charges takes one slot too);
//   - countStatus on such a route: its charge comes after the response,
//     when the request holds nothing any more; costFrom, which charges
//     points when the response ends, neither;
//   - ip as a concurrency layer with credential lists: a credentialed
//     request's ip charge is decided after the response or at the instance
//     after ForwardAuth (../after.go), where no slot can be held for the
//     request's life.
//
// global may be a concurrency layer: the instance's whole in-flight cap, the
// usual protection of a backend that degrades past some parallelism. With
// redis.syncInterval a concurrency layer is counted in Redis exactly, one
// script call each way, while the other layers stay synced
// (../redisstore/slots.go).

// checkConcurrencyLayer checks what a concurrency layer cannot take of its
// own section.
func checkConcurrencyLayer(field string, lc LayerConfig, spec Rule) error {
	if spec.Algorithm != limit.Concurrency || !spec.On() {
		return nil
	}

	if spec.Calendar != 0 {
		return invalid(field+".calendar", lc.Calendar, `takes algorithm "fixed" only, not "concurrency" (a concurrency layer's duration is a request's lease)`)
	}

	if spec.BlockDuration != 0 {
		return invalid(field+".blockDuration", lc.BlockDuration, `does not apply to algorithm "concurrency", whose refusals last while its slots are busy`)
	}

	return nil
}

// checkConcurrency checks what concurrency layers cannot combine with
// elsewhere in the configuration.
func checkConcurrency(s *Settings) error {
	for i, rs := range s.Routes {
		if err := checkConcurrencyRoute("routes["+strconv.Itoa(i)+"]", rs); err != nil {
			return err
		}
	}

	ip := s.Spec(LayerIP)
	if ip.On() && ip.Algorithm == limit.Concurrency && len(s.CredHeaders)+len(s.CredCookies)+len(s.CredQuery) > 0 {
		return invalid("ip.algorithm", "concurrency", "cannot hold a slot for a credentialed request, whose ip charge is decided after the response (principal.credentialHeaders, credentialCookies, credentialQueryParams): use another algorithm on ip, or a route keyed by ip")
	}

	return nil
}

// checkConcurrencyRoute checks a route whose layer or one of whose plans is
// a concurrency layer.
func checkConcurrencyRoute(field string, rs Route) error {
	names := []string{}
	for _, l := range append([]Rule{rs.Rule}, rs.Plans...) {
		if l.On() && l.Algorithm == limit.Concurrency {
			names = append(names, l.Name)
		}
	}

	if len(names) == 0 {
		return nil
	}

	if rs.Cost > 1 {
		return invalid(field+".cost", rs.Cost, "a concurrency layer ("+strings.Join(names, ", ")+") holds one slot per request, whatever its cost: remove the cost, or use another algorithm")
	}

	if rs.CountStatus != nil {
		return invalid(field+".countStatus", sortedCodes(rs.CountStatus), "cannot charge a concurrency layer ("+strings.Join(names, ", ")+") after the response, when the request holds nothing any more")
	}

	if rs.CostFrom != nil {
		return invalid(field+".costFrom", rs.CostFrom.Spec, "charges points when the response ends, and a concurrency layer ("+strings.Join(names, ", ")+") holds one slot per request: give this route another algorithm, and cap requests in flight with a concurrency route of its own on the same paths")
	}

	return nil
}

// sortedCodes is a countStatus list as text.
func sortedCodes(codes map[int]bool) string {
	out := ""
	for code := 100; code < 600; code++ {
		if codes[code] {
			if out != "" {
				out += ","
			}

			out += strconv.Itoa(code)
		}
	}

	return out
}
