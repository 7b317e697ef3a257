package rule

import "github.com/tierlimit/tierlimit/config"

// The layers of a plan, drawn up from configuration's catalogue of
// built-in layers (config.Builtins, config/charges.go): built are the
// built-in layers of an instance, aligned with config.Builtins (nil where
// off).

// BuiltinKeyKind is how the built-in layer row finds its key (KeyOf*),
// unless its key: says otherwise (NewLayer).
func BuiltinKeyKind(row config.Builtin) int {
	switch row.KeyedBy {
	case config.KeyGlobal:
		return KeyOfConst
	case config.KeyPrincipal:
		return KeyOfPrincipal
	}

	return KeyOfClient
}

// RouteKeyKinds are the key: values a route takes and how each finds its key.
var RouteKeyKinds = map[string]int{
	config.KeyIP: KeyOfClient, config.KeyPrincipal: KeyOfPrincipalElseClient, config.KeyGlobal: KeyOfConst,
	config.KeyHost: KeyOfHost, config.KeyHeader: KeyOfHeader, config.KeyParts: KeyOfParts,
}

// On lists the layers that are on (not nil), in order.
func On(layers []*Layer) []*Layer {
	var out []*Layer

	for _, l := range layers {
		if l != nil {
			out = append(out, l)
		}
	}

	return out
}

// ChargedTo lists, in catalogue order, the built layers that are on among
// those of the classes (a plan rule of config/charges.go); nil when none is.
func ChargedTo(built []*Layer, classes []int) []*Layer {
	var out []*Layer

	for i, row := range config.Builtins {
		if built[i] != nil && config.HasClass(classes, row.Charges) {
			out = append(out, built[i])
		}
	}

	return out
}

// NamedPlans draws up the plan of each of plans: (specs, by name), whose
// layers are named (aligned with specs, nil where off: that plan charges
// config.NamedPlan's layers only). nil when there are no plans.
func NamedPlans(built []*Layer, specs []config.Rule, named []*Layer) map[string][]*Layer {
	if len(specs) == 0 {
		return nil
	}

	out := make(map[string][]*Layer, len(specs))

	for i, spec := range specs {
		layers := ChargedTo(built, config.NamedPlan)
		if named[i] != nil {
			layers = append(layers, named[i])
		}

		out[spec.Name] = layers
	}

	return out
}
