package rule

import (
	"reflect"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
)

// TestNewLayerKeepsWhatItsRuleSaysByName: every field the layer's Limits
// shares with config.Rule by name arrives as the rule says it (a duration
// in nanoseconds), so that an option added to both needs no copy of its own.
func TestNewLayerKeepsWhatItsRuleSaysByName(t *testing.T) {
	spec := config.Rule{
		Name: "login", Points: 5, Duration: 90 * time.Second, Algorithm: limit.Fixed,
		KeyHeader: "X-Api-Key", MaxBody: 4096, BlockDuration: 15 * time.Minute,
		Calendar: limit.Day, UtcOffset: int64(7 * time.Hour), DryRun: true, Memory: true,
	}

	l := NewLayer(spec, KeyOfClient)
	got := reflect.ValueOf(l.Limits)
	src := reflect.ValueOf(spec)
	shared := 0

	for i := 0; i < got.NumField(); i++ {
		name := got.Type().Field(i).Name
		sf := src.FieldByName(name)
		if !sf.IsValid() || sf.Kind() != got.Field(i).Kind() || !sf.Type().ConvertibleTo(got.Field(i).Type()) {
			continue
		}

		shared++
		if want := sf.Convert(got.Field(i).Type()).Interface(); !reflect.DeepEqual(got.Field(i).Interface(), want) {
			t.Errorf("Limits.%s = %v, want the rule's %v", name, got.Field(i).Interface(), want)
		}
	}

	// Name, Duration, KeyHeader, MaxBody, Algorithm, BlockDuration,
	// Calendar, UtcOffset, DryRun, Memory.
	if shared < 10 {
		t.Errorf("%d fields shared by name, want at least 10", shared)
	}

	if l.Capacity != 5 || l.KeyKind != KeyOfHeader || l.ConstKey != config.LayerGlobal {
		t.Errorf("capacity %d, key kind %d, const key %q: want 5, KeyOfHeader, %q", l.Capacity, l.KeyKind, l.ConstKey, config.LayerGlobal)
	}
}
