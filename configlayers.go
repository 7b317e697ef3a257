package tierlimit

// The built-in layers as data. builtinLayers is the one list of them: the
// defaults (CreateConfig), parsing and validation (parseBuiltin), the
// reserved route names (parseRoute), maxTracked's minimum (checkMaxTracked),
// the mode choice (chooseMode) and the plans (drawPlans) all read it, so that
// a layer is one row. A plan is drawn up from the classes of requests its
// layers charge (the plan rules below), not from layer names. The plans of
// plans: (configplans.go), charged instead of user, are one more rule
// (namedPlan) with a layer of their own each.

// Layer names. Routes may not take them: they name the built-in layers.
const (
	layerGlobal  = "global"
	layerIP      = "ip"
	layerAssets  = "assets"
	layerUser    = "user"
	layerService = "service"
	// layerWebsocket names the connection cap in refusals and events; no
	// route may take the name.
	layerWebsocket = "websocket"
)

// Key values: the key: forms a layer may take. Routes take all of them (ip
// by default); the tiers take host and header:<Name> (by default their
// request's client or principal); global takes none.
const (
	keyIP        = "ip"
	keyPrincipal = "principal"
	keyGlobal    = "global"
	keyHeader    = "header:"
	keyHost      = "host"
)

// The classes of requests a built-in layer charges.
const (
	chargesAll       = iota // every request
	chargesAnonymous        // a request without a principal, not for an asset
	chargesAsset            // a request without a principal, for an asset (assets.pathPrefixes)
	chargesUser             // a principal that is not a service account
	chargesService          // a service account
)

// builtinLayer is one built-in layer: its name (and section of Config), the
// class of requests it charges, how it finds its key, its defaults and the
// key: values it takes besides none.
type builtinLayer struct {
	name     string
	charges  int
	keyKind  int // layer.go's keyOf*, unless key: says otherwise
	points   int
	duration string
	keys     []string
	// config reads the layer's section of Config.
	config func(c *Config) LayerConfig
	// more parses what else its section holds (assets: the path prefixes);
	// nil when nothing.
	more func(c *Config, s *settings) error
}

// tierKeys are the key: values the tiers take.
var tierKeys = []string{keyHost, keyHeader}

// builtinLayers in evaluation order: a plan charges its layers in this order.
var builtinLayers = []builtinLayer{
	{
		name: layerGlobal, charges: chargesAll, keyKind: keyOfConst, points: 1000, duration: "1s",
		config: func(c *Config) LayerConfig { return c.Global },
	},
	{
		name: layerIP, charges: chargesAnonymous, keyKind: keyOfClient, points: 50, duration: "1s", keys: tierKeys,
		config: func(c *Config) LayerConfig { return c.IP },
	},
	{
		name: layerAssets, charges: chargesAsset, keyKind: keyOfClient, points: 300, duration: "1s", keys: tierKeys,
		config: assetsLayer, more: parseAssetPaths,
	},
	{
		name: layerUser, charges: chargesUser, keyKind: keyOfPrincipal, points: 300, duration: "60s", keys: tierKeys,
		config: func(c *Config) LayerConfig { return c.User },
	},
	{
		name: layerService, charges: chargesService, keyKind: keyOfPrincipal, points: 10000, duration: "60s", keys: tierKeys,
		config: func(c *Config) LayerConfig { return c.Service },
	},
}

func assetsLayer(c *Config) LayerConfig {
	a := c.Assets
	return LayerConfig{Points: a.Points, Duration: a.Duration, Algorithm: a.Algorithm, Burst: a.Burst, Key: a.Key, BlockDuration: a.BlockDuration, Calendar: a.Calendar, UtcOffset: a.UtcOffset, DryRun: a.DryRun, Store: a.Store}
}

// defaultLayer is the built-in layer's default points. Its default duration
// is not written in the section but applied by parseBuiltin, so that a
// duration the user wrote, even the default's value, is told from none
// (calendar takes no duration).
func defaultLayer(name string) LayerConfig {
	for _, row := range builtinLayers {
		if row.name == name {
			return LayerConfig{Points: row.points}
		}
	}

	return LayerConfig{}
}

// takesKey reports whether the built-in layer takes the key: form.
func takesKey(row builtinLayer, key string) bool {
	for _, k := range row.keys {
		if k == key {
			return true
		}
	}

	return false
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

// requestCost is what one request is charged in each layer of its plan
// unless it matches routes: then the largest of their costs (routes[].cost,
// routeSpec.cost; withRoutes).
const requestCost = int64(1)

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
func drawNamedPlans(built []*layer, specs []layerSpec, named []*layer) map[string][]*layer {
	if len(specs) == 0 {
		return nil
	}

	out := make(map[string][]*layer, len(specs))

	for i, spec := range specs {
		layers := chargedTo(built, namedPlan)
		if named[i] != nil {
			layers = append(layers, named[i])
		}

		out[spec.name] = layers
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

func hasClass(classes []int, c int) bool {
	for _, k := range classes {
		if k == c {
			return true
		}
	}

	return false
}

// isBuiltinName reports whether name is a built-in layer's (or the
// connection cap's), which no route may take.
func isBuiltinName(name string) bool {
	if name == layerWebsocket {
		return true
	}

	for _, row := range builtinLayers {
		if row.name == name {
			return true
		}
	}

	return false
}
