package config

import (
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/request"
)

// Plans: the auth server names a principal's plan in principal.planHeader,
// and plans: gives each name the window that replaces user for it. A plan
// is a layer like the others (its name is the layer name in headers, events,
// the status page, metrics and Redis keys), keyed by the principal, and its
// plan rule is NamedPlan (charges.go).

// parsePlans reads plans:, in name order so that the layers, the status page
// and the metrics list them alike on every reload. A plan's name follows the
// rules of a route's and takes no name a layer or route has.
func parsePlans(cfg *Config, s *Settings) error {
	names := make([]string, 0, len(cfg.Plans))
	for name := range cfg.Plans {
		names = append(names, name)
	}

	sort.Strings(names)

	taken := map[string]string{}
	for _, rs := range s.Routes {
		taken[rs.Name] = "is the name of a route"
	}

	for i, rs := range s.Routes {
		for _, p := range rs.Plans {
			if taken[p.Name] != "" {
				return invalid("routes["+strconv.Itoa(i)+"].plans", p.Name, "is the name of a route: rename the route or the plan")
			}

			taken[p.Name] = "is the name of a route's plan"
		}
	}

	for _, name := range names {
		if err := checkPlanName(name, taken); err != nil {
			return err
		}

		spec, err := parsePlan("plans."+name, name, cfg.Plans[name])
		if err != nil {
			return err
		}

		s.Plans = append(s.Plans, spec)
	}

	return nil
}

// checkPlanName checks a plan's name and adds it to those taken. Two plans
// whose names differ only in case are refused: they would be two buckets
// that an operator reads as one.
func checkPlanName(name string, taken map[string]string) error {
	switch {
	case !validName(name):
		return invalid("plans", name, "a plan's name must be 1-64 characters of A-Z a-z 0-9 _ - .")
	case IsBuiltinName(name):
		return invalid("plans", name, "is the name of a built-in layer")
	case taken[name] != "":
		return invalid("plans", name, taken[name])
	case taken[strings.ToLower(name)] != "":
		return invalid("plans", name, taken[strings.ToLower(name)])
	}

	taken[name] = "is used by another plan"
	taken[strings.ToLower(name)] = "differs only in case from another plan"

	return nil
}

// parsePlan reads one plan's window. A plan with points 0 needs no
// duration: it is off, and its principals are charged global only.
func parsePlan(field, name string, pc PlanConfig) (Rule, error) {
	lc := layerOf(pc)
	if lc.Points == 0 && strings.TrimSpace(lc.Duration) == "" && lc.Calendar == "" {
		lc.Duration = "1s"
	}

	return parseLayer(field, name, lc)
}

// parsePlanHeader reads principal.planHeader. It is trusted only where
// userHeader is (after ForwardAuth, which must list it in
// authResponseHeaders), so setting it without userHeader is an error rather
// than a header silently ignored; plans without it could never be charged.
// With no plans the header is not read: every principal is charged to user.
func parsePlanHeader(cfg *Config, s *Settings) error {
	h := cfg.Principal.PlanHeader

	routePlans := ""
	for i, rc := range cfg.Routes {
		if len(rc.Plans) > 0 && routePlans == "" {
			routePlans = "routes[" + strconv.Itoa(i) + "].plans"
		}
	}

	switch {
	case h == "" && len(cfg.Plans) > 0:
		return invalid("principal.planHeader", h, "plans are set but no header names a principal's plan")
	case h == "" && routePlans != "":
		return invalid("principal.planHeader", h, routePlans+" is set but no header names a principal's plan")
	case h == "":
		return nil
	case !request.ValidToken(h):
		return invalid("principal.planHeader", h, "not a header name")
	case s.UserHeader == "":
		return invalid("principal.planHeader", h,
			"needs principal.userHeader: a plan is read only on an instance after ForwardAuth, which sets both")
	}

	canonical := http.CanonicalHeaderKey(h)
	if canonical == s.UserHeader || canonical == s.ServiceHeader {
		return invalid("principal.planHeader", h, "is the principal's or the service-account flag's header")
	}

	if len(s.Plans) > 0 || routePlans != "" {
		s.PlanHeader = canonical
	}

	return nil
}

// parseRoutePlans reads a route's plans, in name order: each a window of its
// own, named <route>.<plan> in headers, events, the status page, metrics and
// Redis keys, keyed as the route is (its key: setting). The route's cost
// must fit each plan's window as it fits the route's.
func parseRoutePlans(field string, rc RouteConfig, spec *Route) error {
	names := make([]string, 0, len(rc.Plans))
	for name := range rc.Plans {
		names = append(names, name)
	}

	sort.Strings(names)

	for _, name := range names {
		pf := field + ".plans." + name
		if !validName(name) || len(rc.Name)+1+len(name) > 64 {
			return invalid(field+".plans", name, "a plan's name must be of A-Z a-z 0-9 _ - ., at most 64 characters with the route's name and a dot")
		}

		rule, err := parsePlan(pf, RoutePlanName(rc.Name, name), rc.Plans[name])
		if err != nil {
			return err
		}

		// A route with points 0 matches nothing (the root builds no route
		// for it), so a plan's limit on it would be silently ignored.
		if rule.On() && !spec.On() {
			return invalid(pf+".points", rule.Points, "is ignored on a route with points 0 (off), which matches nothing: give the route points (a plan's points 0 means no limit for that plan)")
		}

		capacity := limit.Capacity(rule.Algorithm, rule.Points, rule.Burst)

		if rule.On() && spec.Cost > capacity && rc.CostFrom == "" {
			return invalid(pf+".points", rule.Points, "holds less than the route's cost, "+strconv.FormatInt(spec.Cost, 10)+": no request could ever be served")
		}

		spec.Plans = append(spec.Plans, rule)
	}

	return nil
}

// RoutePlanName is the layer name of a route's plan.
func RoutePlanName(route, plan string) string {
	return route + "." + plan
}
