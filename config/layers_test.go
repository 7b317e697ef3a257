package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestCatalogueDrivesDefaultsAndKeys: Defaults' layer defaults are the
// catalogue's, every built-in name is reserved for routes, and only the
// layers whose row takes a key accept one.
func TestCatalogueDrivesDefaultsAndKeys(t *testing.T) {
	s, err := Parse(Defaults())
	if err != nil {
		t.Fatal(err)
	}

	for i, row := range Builtins {
		spec := s.Builtin[i]
		if spec.Name != row.Name || spec.Points != int64(row.Points) || spec.Duration != mustDuration(t, row.Duration) {
			t.Errorf("%s: parsed %+v from the defaults, want %d/%s", row.Name, spec, row.Points, row.Duration)
		}

		if !IsBuiltinName(row.Name) {
			t.Errorf("%s: not reserved for routes", row.Name)
		}

		cfg := Defaults()
		cfg.Routes = []RouteConfig{{Name: row.Name, Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		if _, err := Parse(cfg); err == nil || !strings.Contains(err.Error(), "is the name of a built-in layer") {
			t.Errorf("route named %s: %v", row.Name, err)
		}
	}

	for _, row := range Builtins {
		cfg := Defaults()
		lcKey(cfg, row.Name, "header:X-Api-Key")

		_, err := Parse(cfg)
		if TakesKey(row, KeyHeader) != (err == nil) {
			t.Errorf("%s.key header:X-Api-Key: %v, row takes %v", row.Name, err, row.Keys)
		}
	}
}

func mustDuration(t *testing.T, raw string) time.Duration {
	t.Helper()

	d, err := ParseDuration(raw)
	if err != nil {
		t.Fatal(err)
	}

	return d
}

// lcKey sets the key of the built-in layer called name.
func lcKey(c *Config, name, key string) {
	switch name {
	case LayerGlobal:
		c.Global.Key = key
	case LayerIP:
		c.IP.Key = key
	case LayerAssets:
		c.Assets.Key = key
	case LayerUser:
		c.User.Key = key
	case LayerService:
		c.Service.Key = key
	}
}

// TestEverySectionsWindowReachesParseLayer: what assets, a route and a plan
// say of their window is the LayerConfig parseLayer reads, field by field,
// so that an option added to the sections needs no list kept beside them.
func TestEverySectionsWindowReachesParseLayer(t *testing.T) {
	for _, section := range []interface{}{AssetsConfig{}, RouteConfig{}, PlanConfig{}} {
		src := reflect.New(reflect.TypeOf(section)).Elem()
		st := src.Type()

		for i := 0; i < st.NumField(); i++ {
			switch f := src.Field(i); f.Kind() {
			case reflect.String:
				f.SetString(st.Field(i).Name)
			case reflect.Int:
				f.SetInt(int64(i + 1))
			case reflect.Bool:
				f.SetBool(true)
			}
		}

		lc := reflect.ValueOf(layerOf(src.Interface()))
		lt := lc.Type()

		for i := 0; i < lt.NumField(); i++ {
			name := lt.Field(i).Name
			if sf, ok := st.FieldByName(name); ok && name != unknownField && sf.Type == lt.Field(i).Type {
				if got, want := lc.Field(i).Interface(), src.FieldByName(name).Interface(); !reflect.DeepEqual(got, want) {
					t.Errorf("%s.%s reaches parseLayer as %v, want %v", st.Name(), name, got, want)
				}
			}
		}
	}
}
