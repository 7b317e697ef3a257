package tierlimit

import "github.com/tierlimit/tierlimit/config"

// The built-in layers as data. builtinLayers is config.Builtins (the
// defaults, parsing and validation: config/layers.go) with what each layer
// charges: the mode choice (chooseMode) and the plans (drawPlans) read it, so
// that a layer is one row. A plan is drawn up from the classes of requests its
// layers charge (the plan rules below), not from layer names. The plans of
// plans: (config/plans.go), charged instead of user, are one more rule
// (namedPlan) with a layer of their own each.

// Layer names and key values: configuration's (config/layers.go).
const (
	layerGlobal    = config.LayerGlobal
	layerIP        = config.LayerIP
	layerAssets    = config.LayerAssets
	layerUser      = config.LayerUser
	layerService   = config.LayerService
	layerWebsocket = config.LayerWebsocket

	keyIP        = config.KeyIP
	keyPrincipal = config.KeyPrincipal
	keyGlobal    = config.KeyGlobal
	keyHeader    = config.KeyHeader
	keyHost      = config.KeyHost
)

// The classes of requests a built-in layer charges.
const (
	chargesAll       = iota // every request
	chargesAnonymous        // a request without a principal, not for an asset
	chargesAsset            // a request without a principal, for an asset (assets.pathPrefixes)
	chargesUser             // a principal that is not a service account
	chargesService          // a service account
)

// builtinLayer is one built-in layer: configuration's row (its name,
// defaults and keys), the class of requests it charges and how it finds its
// key.
type builtinLayer struct {
	config.Builtin
	charges int
	keyKind int // layer.go's keyOf*, unless key: says otherwise
}

// builtinLayers in evaluation order, row for row config.Builtins: a plan
// charges its layers in this order.
var builtinLayers = []builtinLayer{
	{Builtin: config.Builtins[0], charges: chargesAll, keyKind: keyOfConst},
	{Builtin: config.Builtins[1], charges: chargesAnonymous, keyKind: keyOfClient},
	{Builtin: config.Builtins[2], charges: chargesAsset, keyKind: keyOfClient},
	{Builtin: config.Builtins[3], charges: chargesUser, keyKind: keyOfPrincipal},
	{Builtin: config.Builtins[4], charges: chargesService, keyKind: keyOfPrincipal},
}

// routeKeyKinds are the key: values a route takes and how each finds its key.
var routeKeyKinds = map[string]int{
	keyIP: keyOfClient, keyPrincipal: keyOfPrincipalElseClient, keyGlobal: keyOfConst, keyHost: keyOfHost, keyHeader: keyOfHeader,
}

// The plan rules: the classes of built-in layers each plan of plugin.go
// charges, in catalogue order. A credentialed request is charged the
// layers every request pays (planCred), and, once its credential is known
// invalid, the anonymous ones (planInvalid).
var (
	anonymousPlan = []int{chargesAll, chargesAnonymous}
	assetPlan     = []int{chargesAll, chargesAsset}
	userPlan      = []int{chargesAll, chargesUser}
	servicePlan   = []int{chargesAll, chargesService}
	credPlan      = []int{chargesAll}
	invalidPlan   = []int{chargesAnonymous}
	// exemptPlan: an exempt request still pays what every request does,
	// unless exempt.global.
	exemptPlan = []int{chargesAll}
	// namedPlan: a principal whose plan header names one of plans: pays
	// what every request does, then its plan's own layer (drawNamedPlans),
	// in place of userPlan. Service accounts keep servicePlan.
	namedPlan = []int{chargesAll}
)

// requestCost is what one request is charged (config.RequestCost).
const requestCost = config.RequestCost

// drawPlans draws up the plans from the built-in layers, built aligned with
// builtinLayers (nil where off).
func drawPlans(built []*layer) plans {
	return plans{
		planIP:      chargedTo(built, anonymousPlan),
		planAssets:  chargedTo(built, assetPlan),
		planUser:    chargedTo(built, userPlan),
		planService: chargedTo(built, servicePlan),
		planCred:    chargedTo(built, credPlan),
		planInvalid: chargedTo(built, invalidPlan),
		planCost:    requestCost,
	}
}

// drawNamedPlans draws up the plan of each of plans: (specs, by name), whose
// layers are named (aligned with specs, nil where off: that plan charges
// namedPlan's layers only). nil when there are no plans.
func drawNamedPlans(built []*layer, specs []config.Rule, named []*layer) map[string][]*layer {
	if len(specs) == 0 {
		return nil
	}

	out := make(map[string][]*layer, len(specs))

	for i, spec := range specs {
		layers := chargedTo(built, namedPlan)
		if named[i] != nil {
			layers = append(layers, named[i])
		}

		out[spec.Name] = layers
	}

	return out
}

// chargedTo lists, in catalogue order, the layers that are on among those of
// the classes; nil when none is.
func chargedTo(built []*layer, classes []int) []*layer {
	var out []*layer

	for i, row := range builtinLayers {
		if built[i] != nil && hasClass(classes, row.charges) {
			out = append(out, built[i])
		}
	}

	return out
}

// planOn reports whether some built-in layer of the classes is on: whether
// the plan of those classes charges anything but routes.
func planOn(s *config.Settings, classes []int) bool {
	for i, row := range builtinLayers {
		if s.Builtin[i].On() && hasClass(classes, row.charges) {
			return true
		}
	}

	return false
}

func hasClass(classes []int, c int) bool {
	for _, k := range classes {
		if k == c {
			return true
		}
	}

	return false
}
