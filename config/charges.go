package config

import "github.com/tierlimit/tierlimit/limit"

// What each built-in layer charges. A plan (the root's plans, drawn up by
// rule.ChargedTo) is drawn up from the classes of requests its layers
// charge, not from layer names: a built-in layer is one row of Builtins,
// its class (Builtin.Charges) included. The plans of plans: (plans.go),
// charged instead of user, are one more rule (NamedPlan) with a layer of
// their own each.

// The classes of requests a built-in layer charges.
const (
	ChargesAll       = iota // every request
	ChargesAnonymous        // a request without a principal, not for an asset
	ChargesAsset            // a request without a principal, for an asset (assets.pathPrefixes)
	ChargesUser             // a principal that is not a service account
	ChargesService          // a service account
)

// The plan rules: the classes of built-in layers each plan charges, in
// catalogue order. A credentialed request is charged the layers every
// request pays (CredPlan), and, once its credential is known invalid, the
// anonymous ones (InvalidPlan).
var (
	AnonymousPlan = []int{ChargesAll, ChargesAnonymous}
	AssetPlan     = []int{ChargesAll, ChargesAsset}
	UserPlan      = []int{ChargesAll, ChargesUser}
	ServicePlan   = []int{ChargesAll, ChargesService}
	CredPlan      = []int{ChargesAll}
	InvalidPlan   = []int{ChargesAnonymous}
	// ExemptPlan: an exempt request still pays what every request does,
	// unless exempt.global.
	ExemptPlan = []int{ChargesAll}
	// NamedPlan: a principal whose plan header names one of plans: pays
	// what every request does, then its plan's own layer, in place of
	// UserPlan. Service accounts keep ServicePlan.
	NamedPlan = []int{ChargesAll}
)

// HasClass reports whether classes holds c.
func HasClass(classes []int, c int) bool {
	for _, k := range classes {
		if k == c {
			return true
		}
	}

	return false
}

// PlanOn reports whether some built-in layer of the classes is on: whether
// the plan of those classes charges anything but routes.
func PlanOn(s *Settings, classes []int) bool {
	for i, row := range Builtins {
		if s.Builtin[i].On() && HasClass(classes, row.Charges) {
			return true
		}
	}

	return false
}

// AnonymousPlanMayBeEmpty reports whether an anonymous request may meet a
// plan with no layer: the anonymous one, or, when there are asset paths,
// the assets one.
func AnonymousPlanMayBeEmpty(s *Settings) bool {
	return !PlanOn(s, AnonymousPlan) || len(s.AssetPaths) > 0 && !PlanOn(s, AssetPlan)
}

// NeverCharged reports whether an instance never charges the built-in layer
// called name, whatever its points: user and service without a principal
// (principal.userHeader empty, the edge), service without its flag's header,
// assets without asset paths.
func NeverCharged(s *Settings, name string) bool {
	switch name {
	case LayerUser:
		return s.UserHeader == ""
	case LayerService:
		return s.UserHeader == "" || s.ServiceHeader == ""
	case LayerAssets:
		return len(s.AssetPaths) == 0
	}

	return false
}

// AnyMemoryLayer reports whether a layer of a Redis instance is counted in
// memory.
func AnyMemoryLayer(s *Settings) bool {
	if s.Store != StoreRedis {
		return false
	}

	for _, l := range Rules(s) {
		if l.Memory && l.On() {
			return true
		}
	}

	return false
}

// AnyConcurrency reports whether a layer that is on is a concurrency layer.
func AnyConcurrency(s *Settings) bool {
	for _, l := range Rules(s) {
		if l.On() && l.Algorithm == limit.Concurrency {
			return true
		}
	}

	return false
}

// AnyCostFrom reports whether a route charges what its response reports.
func AnyCostFrom(s *Settings) bool {
	for _, r := range s.Routes {
		if r.CostFrom != nil {
			return true
		}
	}

	return false
}
