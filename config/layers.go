package config

import "reflect"

// The built-in layers as data. Builtins is the one list of them: the
// defaults (Defaults), parsing and validation (parseBuiltin), the reserved
// route names (checkRouteName), maxTracked's minimum (checkMaxTracked), the
// class of requests each charges, from which the plans are drawn up
// (charges.go), and what keys it (rule.BuiltinKeyKind).

// Layer names. Routes may not take them: they name the built-in layers.
const (
	LayerGlobal  = "global"
	LayerIP      = "ip"
	LayerAssets  = "assets"
	LayerUser    = "user"
	LayerService = "service"
	// LayerWebsocket names the connection cap in refusals and events; no
	// route may take the name.
	LayerWebsocket = "websocket"
)

// Key values: the key: forms a layer may take. Routes take all of them (ip
// by default); the tiers take host and header:<Name> (by default their
// request's client or principal); global takes none.
const (
	KeyIP        = "ip"
	KeyPrincipal = "principal"
	KeyGlobal    = "global"
	KeyHeader    = "header:"
	KeyHost      = "host"
	// KeyJSON is a source of a route key that reads the request's JSON
	// body (bodykeys.go); KeyParts is a route's Key when its key has such a
	// source or several sources (Rule.KeyParts), which no user writes.
	KeyJSON  = "json:"
	KeyParts = "parts"
)

// The stores: Settings.Store, and a rule's store.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// RequestCost is what one request is charged in each layer of its plan
// unless it matches routes: then the largest of their costs (routes[].cost,
// Route.Cost).
const RequestCost = int64(1)

// Builtin is one built-in layer: its name (and section of Config), its
// defaults, the key: values it takes besides none, what keys it without
// key: (KeyGlobal, KeyIP or KeyPrincipal) and the class of requests it
// charges (Charges*).
type Builtin struct {
	Name     string
	Points   int
	Duration string
	Keys     []string
	KeyedBy  string
	Charges  int
	// config reads the layer's section of Config.
	config func(c *Config) LayerConfig
	// more parses what else its section holds (assets: the path prefixes);
	// nil when nothing.
	more func(c *Config, s *Settings) error
}

// tierKeys are the key: values the tiers take.
var tierKeys = []string{KeyHost, KeyHeader}

// Builtins in evaluation order: a plan charges its layers in this order.
var Builtins = []Builtin{
	{
		Name: LayerGlobal, Points: 1000, Duration: "1s",
		KeyedBy: KeyGlobal, Charges: ChargesAll,
		config: func(c *Config) LayerConfig { return c.Global },
	},
	{
		Name: LayerIP, Points: 50, Duration: "1s", Keys: tierKeys,
		KeyedBy: KeyIP, Charges: ChargesAnonymous,
		config: func(c *Config) LayerConfig { return c.IP },
	},
	{
		Name: LayerAssets, Points: 300, Duration: "1s", Keys: tierKeys,
		KeyedBy: KeyIP, Charges: ChargesAsset,
		config: assetsLayer, more: parseAssetPaths,
	},
	{
		Name: LayerUser, Points: 300, Duration: "60s", Keys: tierKeys,
		KeyedBy: KeyPrincipal, Charges: ChargesUser,
		config: func(c *Config) LayerConfig { return c.User },
	},
	{
		Name: LayerService, Points: 10000, Duration: "60s", Keys: tierKeys,
		KeyedBy: KeyPrincipal, Charges: ChargesService,
		config: func(c *Config) LayerConfig { return c.Service },
	},
}

func assetsLayer(c *Config) LayerConfig { return layerOf(c.Assets) }

// layerOf is the window of a section that has one besides what else it
// says (AssetsConfig, RouteConfig, PlanConfig): each field of LayerConfig
// that the section has (CopyByName). An option added to the sections
// reaches parseLayer with no list of fields to keep; a section's own fields
// (a route's paths, a route's key, which parseLayer does not read) are its
// parser's.
func layerOf(section interface{}) LayerConfig {
	var lc LayerConfig

	CopyByName(reflect.ValueOf(&lc).Elem(), reflect.ValueOf(section))

	return lc
}

// CopyByName sets each field of the struct dst (addressable) that the
// struct src has by the same name, with a type of the same kind convertible
// to it (a time.Duration into an int64): how a value made from another by
// its names (a section's window, a layer's rule: rule.NewLayer) takes an
// option added to both with no list of fields to keep. Done in New, never
// on a request. The caller makes the reflect.Values: under Yaegi, fields set
// through a pointer that reached interpreted code as an interface{} did not
// reach the caller's value (every layer lost its rule: the allocation
// budgets tripled).
func CopyByName(dst, src reflect.Value) {
	for i := 0; i < dst.NumField(); i++ {
		f := dst.Type().Field(i)
		if sf, ok := src.Type().FieldByName(f.Name); ok && sf.Type.Kind() == f.Type.Kind() && sf.Type.ConvertibleTo(f.Type) {
			dst.Field(i).Set(src.FieldByIndex(sf.Index).Convert(f.Type))
		}
	}
}

// defaultLayer is the built-in layer's default points. Its default duration
// is not written in the section but applied by parseBuiltin, so that a
// duration the user wrote, even the default's value, is told from none
// (calendar takes no duration).
func defaultLayer(name string) LayerConfig {
	for _, row := range Builtins {
		if row.Name == name {
			return LayerConfig{Points: row.Points}
		}
	}

	return LayerConfig{}
}

// TakesKey reports whether the built-in layer takes the key: form.
func TakesKey(row Builtin, key string) bool {
	for _, k := range row.Keys {
		if k == key {
			return true
		}
	}

	return false
}

// routeKeys are the key: values a route takes.
var routeKeys = []string{KeyIP, KeyPrincipal, KeyGlobal, KeyHost, KeyHeader}

// IsBuiltinName reports whether name is a built-in layer's (or the
// connection cap's), which no route may take.
func IsBuiltinName(name string) bool {
	if name == LayerWebsocket {
		return true
	}

	for _, row := range Builtins {
		if row.Name == name {
			return true
		}
	}

	return false
}
