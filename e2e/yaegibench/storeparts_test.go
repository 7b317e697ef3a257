package yaegibench

import "testing"

// storePartsProbe reaches each layer's counters (a counter.Table) in the
// ways a store could find them, each in a loop like the anonymous path's
// charge (../../paths.tmpl: charge) over the same two layers: through the
// layer (rule.Layer embeds the store's part, as it does), by the layer's
// position in a list of the store's, from a list beside the layers, from a
// map keyed by the layer, from an untyped field asserted, and from the
// store's own list of its layers, each embedding the layer beside its part.
const storePartsProbe = `package probe

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/rule"
)

type bound struct {
	*rule.Layer
	*counter.Table
}

type placed struct {
	*rule.Layer
	Pos int
}

type untyped struct {
	*rule.Layer
	Part any
}

var (
	layers  []*rule.Layer
	tables  []*counter.Table
	byLayer = map[*rule.Layer]*counter.Table{}
	anyList []*untyped
	own     []*bound
	placedL []*placed
)

func init() {
	list := &counter.List{Duration: 1}
	for i := 0; i < 2; i++ {
		t := &counter.Table{Entries: map[string]*counter.Entry{"k": {Count: 1, List: list}}, List: list}
		l := &rule.Layer{Limits: rule.Limits{Capacity: 10}, Table: t}
		layers = append(layers, l)
		tables = append(tables, t)
		byLayer[l] = t
		anyList = append(anyList, &untyped{Layer: l, Part: t})
		own = append(own, &bound{Layer: l, Table: t})
		placedL = append(placedL, &placed{Layer: l, Pos: i})
	}
}

func Embedded(key string) int64 {
	var n int64
	for _, l := range layers {
		w := l.Entries[key]
		if w != nil && w.List == l.List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}

func Position(key string) int64 {
	var n int64
	for _, l := range placedL {
		w := tables[l.Pos].Entries[key]
		if w != nil && w.List == tables[l.Pos].List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}

func Beside(key string) int64 {
	var n int64
	for i, l := range layers {
		w := tables[i].Entries[key]
		if w != nil && w.List == tables[i].List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}

func Keyed(key string) int64 {
	var n int64
	for _, l := range layers {
		t := byLayer[l]
		w := t.Entries[key]
		if w != nil && w.List == t.List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}

func Asserted(key string) int64 {
	var n int64
	for _, l := range anyList {
		t := l.Part.(*counter.Table)
		w := t.Entries[key]
		if w != nil && w.List == t.List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}

func Own(key string) int64 {
	var n int64
	for _, l := range own {
		w := l.Entries[key]
		if w != nil && w.List == l.List && w.Count < l.Capacity {
			n++
		}
	}
	return n
}
`

// TestALayerReachesItsStoresPartsOnlyThroughItselfForFreeUnderYaegi is why
// rule.Layer points to each store's part of it (the memory store's
// counter.Table, the Redis store's rediscall.Encoding: ../../rule/a_types.go)
// rather than a store keeping its parts apart: under Yaegi v0.16.1 only a
// list whose elements embed the part reaches it for nothing; a lookup (the
// layer's position, a list beside the layers, a map, an untyped field)
// costs allocations on every request, and the one free form apart from the
// layer, a store's own list of its layers, needs a list per store wherever
// a request's layers are listed (the routed paths make theirs per
// request). The test fails when that stops being so: a lookup free, the
// layer could drop the stores' parts.
func TestALayerReachesItsStoresPartsOnlyThroughItselfForFreeUnderYaegi(t *testing.T) {
	i := probeInterpreter(t, storePartsProbe)

	allocs := func(fn string) float64 {
		v, err := i.Eval("probe." + fn)
		if err != nil {
			t.Fatal(err)
		}

		f, ok := v.Interface().(func(string) int64)
		if !ok {
			t.Fatalf("probe.%s is a %T", fn, v.Interface())
		}

		if n := f("k"); n != 2 {
			t.Fatalf("probe.%s counts %d layers with room, want 2", fn, n)
		}

		return testing.AllocsPerRun(100, func() { f("k") })
	}

	through := allocs("Embedded")
	t.Logf("through the layer: %v allocations per call", through)

	own := allocs("Own")
	t.Logf("the store's own list: %v allocations per call", own)

	if own > through {
		t.Errorf("the store's own list of its layers: %v allocations per call, %v through the layer; want no more", own, through)
	}

	for _, form := range []string{"Position", "Beside", "Keyed", "Asserted"} {
		a := allocs(form)
		t.Logf("%s: %v allocations per call (+%v)", form, a, a-through)

		if a <= through {
			t.Errorf("%s: %v allocations per call, %v through the layer: a store can find its part of a layer for nothing; rule.Layer can drop the stores' parts (rule/a_types.go)", form, a, through)
		}
	}
}
