package status

import (
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// page is an instance of one layer of 5 per second keyed by client, in
// memory, as New hands it over.
func page(name, layer string) *Page {
	s := memstore.NewWindowStore(100)
	l := rule.NewLayer(config.Rule{Name: layer, Points: 5, Duration: time.Second}, rule.KeyOfClient)
	s.Attach(l)

	return &Page{Name: name, Store: "memory", Layers: []*rule.Layer{l}, Memory: s, Meters: make([]*Meter, 1)}
}

func TestMetricsEscapeLabelValues(t *testing.T) {
	text := Metrics(page("we\"ird\\name\n"+t.Name(), `a"b`), time.Now().UnixNano())

	for _, want := range []string{
		`tierlimit_redis_fallback{middleware="we\"ird\\name\n` + t.Name() + `"} 0`,
		`tierlimit_layer_limit{middleware="we\"ird\\name\n` + t.Name() + `",layer="a\"b"} 5`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Fatalf("escaping: no %s in\n%s", want, text)
		}
	}
}
