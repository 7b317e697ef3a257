package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"

	"github.com/tierlimit/tierlimit"
)

// exported scrapes a plugin instance's <status.path>/metrics and returns each
// metric name with its label names.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()

	cfg := tierlimit.CreateConfig()
	cfg.Status.Path = "/_ratelimit"

	h, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "dashboard@file")
	if err != nil {
		t.Fatal(err)
	}

	req := httptest.NewRequest(http.MethodGet, "http://traefik/_ratelimit/metrics", nil)
	req.RemoteAddr = "127.0.0.1:40000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	if rec.Code != http.StatusOK {
		t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
	}

	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	metrics := map[string]map[string]bool{}

	for _, line := range strings.Split(rec.Body.String(), "\n") {
		m := sample.FindStringSubmatch(line)
		if m == nil {
			continue
		}

		if metrics[m[1]] == nil {
			metrics[m[1]] = map[string]bool{}
		}

		for _, l := range label.FindAllStringSubmatch(m[3], -1) {
			metrics[m[1]][l[1]] = true
		}
	}

	if len(metrics) == 0 {
		t.Fatalf("no metrics in %q", rec.Body)
	}

	return metrics
}

type dashboard struct {
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
	Templating struct {
		List []struct {
			Name     string
			Type     string
			AllValue string
			Query    json.RawMessage
		}
	}
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "grafana", "tierlimit.json"))
	if err != nil {
		t.Fatal(err)
	}

	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("examples/grafana/tierlimit.json: %v", err)
	}

	return d
}

// expand replaces Grafana's variables with values PromQL accepts: interval
// variables by a duration, the dashboard's own by their "All" or current value.
func expand(t *testing.T, d dashboard, expr string) string {
	t.Helper()

	pairs := []string{"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h"}

	for _, v := range d.Templating.List {
		value := v.AllValue
		if v.Type == "textbox" {
			if err := json.Unmarshal(v.Query, &value); err != nil {
				t.Fatalf("variable %s: %v", v.Name, err)
			}
		}

		pairs = append(pairs, "${"+v.Name+"}", value, "$"+v.Name, value)
	}

	out := strings.NewReplacer(pairs...).Replace(expr)
	if strings.Contains(out, "$") {
		t.Fatalf("%q: an unknown variable is left in %q", expr, out)
	}

	return out
}

// Labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"instance": true, "job": true}

// TestDashboardQueriesUseExportedMetrics parses every panel's PromQL with
// Prometheus's own parser and checks each metric and label it names against
// what the plugin exports.
func TestDashboardQueriesUseExportedMetrics(t *testing.T) {
	metrics := exported(t)
	d := readDashboard(t)
	used := map[string]bool{}
	refusals := false

	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}

		for _, target := range p.Targets {
			expr, err := parser.ParseExpr(expand(t, d, target.Expr))
			if err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, target.Expr, err)
				continue
			}

			// Labels every selector of the query carries, for its by () clauses.
			known := map[string]bool{}
			for l := range targetLabels {
				known[l] = true
			}

			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				vs, ok := node.(*parser.VectorSelector)
				if !ok {
					return nil
				}

				labels, ok := metrics[vs.Name]
				if !ok {
					t.Errorf("panel %q: %s is not a metric the plugin exports (%v)", p.Title, vs.Name, names(metrics))
					return nil
				}

				used[vs.Name] = true

				for l := range labels {
					known[l] = true
				}

				for _, m := range vs.LabelMatchers {
					if m.Name != "__name__" && !labels[m.Name] && !targetLabels[m.Name] {
						t.Errorf("panel %q: %s has no label %s", p.Title, vs.Name, m.Name)
					}

					if vs.Name == "tierlimit_requests_total" && m.Name == "decision" && m.Value == "refused" {
						refusals = true
					}
				}

				return nil
			})

			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				if agg, ok := node.(*parser.AggregateExpr); ok {
					for _, l := range agg.Grouping {
						if !known[l] {
							t.Errorf("panel %q: by (%s): no metric of the query has that label", p.Title, l)
						}
					}
				}

				return nil
			})
		}
	}

	for _, want := range []string{"tierlimit_requests_total", "tierlimit_limited_keys", "tierlimit_tracked_keys", "tierlimit_redis_fallback"} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}

	if !refusals {
		t.Error("no panel shows refusals (tierlimit_requests_total{decision=\"refused\"})")
	}
}

// TestDashboardVariables: the middleware variable lists the values of a label
// the plugin exports.
func TestDashboardVariables(t *testing.T) {
	metrics := exported(t)
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

	for _, v := range readDashboard(t).Templating.List {
		if v.Type != "query" {
			continue
		}

		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}

		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil || !metrics[m[1]][m[2]] {
			t.Errorf("variable %s: %q does not list a label the plugin exports", v.Name, q.Query)
		}
	}
}

func names(m map[string]map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}

	sort.Strings(out)

	return out
}
