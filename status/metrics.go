package status

import (
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// <status.path>/metrics: the status endpoint's counters in the Prometheus text
// exposition format (version 0.0.4), one family after the other, each with
// its HELP and TYPE lines. Labels: middleware (the qualified middleware name,
// e.g. edge@file) and layer.

var metricsContentType = []string{"text/plain; version=0.0.4; charset=utf-8"}

// labelEscaper escapes a label value as the format requires.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// Metrics renders the metrics at now.
func Metrics(pg *Page, now int64) string {
	limited, tracked := liveKeys(pg, now, true, "")

	mw := `middleware="` + labelEscaper.Replace(pg.Name) + `"`

	labels := make([]string, len(pg.Layers))
	for i, l := range pg.Layers {
		labels[i] = mw + `,layer="` + labelEscaper.Replace(l.Name) + `"`
	}

	var b strings.Builder

	requestMetrics(&b, pg, labels)
	keyMetrics(&b, pg.Layers, labels, tracked, limited)
	layerMetrics(&b, pg.Layers, labels)
	inFlightMetrics(&b, pg, labels, now)

	fallback := "0"
	if redisFallback(pg) {
		fallback = "1"
	}

	family(&b, "tierlimit_redis_fallback", "gauge", "1 while Redis is failing and the in-memory store decides, else 0.")
	sample(&b, "tierlimit_redis_fallback", mw, fallback)
	family(&b, "tierlimit_evictions_total", "counter", "Live keys dropped from memory at maxTracked since the process started.")
	sample(&b, "tierlimit_evictions_total", mw, formatInt(pg.Memory.Evicted()))

	registryMetrics(&b, pg.Registries)

	return b.String()
}

// requestMetrics writes each layer's decisions; labels are the layers'.
func requestMetrics(b *strings.Builder, pg *Page, labels []string) {
	family(b, "tierlimit_requests_total", "counter", "Requests each layer allowed or refused since the process started.")

	for i, l := range pg.Layers {
		allowed, refused := pg.Memory.Totals(l.Stats)
		sample(b, "tierlimit_requests_total", labels[i]+`,decision="allowed"`, formatInt(allowed))
		sample(b, "tierlimit_requests_total", labels[i]+`,decision="refused"`, formatInt(refused))
	}
}

// keyMetrics writes the keys each layer holds (tracked, aligned with
// layers) and how many of the live ones are over the limit.
func keyMetrics(b *strings.Builder, layers []*rule.Layer, labels []string, tracked []int, limited []liveKey) {
	perLayer := make([]int, len(layers))
	for _, e := range limited {
		perLayer[e.layer]++
	}

	family(b, "tierlimit_tracked_keys", "gauge", "Keys held in memory for the layer, live or expired but not yet purged.")

	for i := range layers {
		sample(b, "tierlimit_tracked_keys", labels[i], strconv.Itoa(tracked[i]))
	}

	family(b, "tierlimit_limited_keys", "gauge", "Live keys over the layer's limit.")

	for i := range layers {
		sample(b, "tierlimit_limited_keys", labels[i], strconv.Itoa(perLayer[i]))
	}
}

// layerMetrics writes each layer's configured limit and window.
func layerMetrics(b *strings.Builder, layers []*rule.Layer, labels []string) {
	family(b, "tierlimit_layer_limit", "gauge", "Requests the layer allows per key and window (points).")

	for i, l := range layers {
		sample(b, "tierlimit_layer_limit", labels[i], formatInt(l.Capacity))
	}

	family(b, "tierlimit_layer_window_seconds", "gauge", "The layer's window (duration) in seconds.")

	for i, l := range layers {
		sample(b, "tierlimit_layer_window_seconds", labels[i], strconv.FormatFloat(float64(l.Duration)/1e9, 'g', -1, 64))
	}

	meterMetrics(b, layers, labels)
}

// meterMetrics writes what the costFrom routes' layers hold and settled
// (../meter.go); labels are the layers'.
func meterMetrics(b *strings.Builder, layers []*rule.Layer, labels []string) {
	for _, f := range []struct {
		name, kind, help string
		value            func(st *rule.Stats) int64
	}{
		{"tierlimit_reserved_requests", "gauge", "Requests holding a reservation in a costFrom route's layer: admitted, their response not ended.",
			func(st *rule.Stats) int64 { return atomic.LoadInt64(&st.Reserved) }},
		{"tierlimit_settled_points_total", "counter", "Points the responses of a costFrom route reported, since the process started.",
			func(st *rule.Stats) int64 { return atomic.LoadInt64(&st.Settled) }},
		{"tierlimit_unreported_total", "counter", "Responses of a costFrom route that reported no cost (the request stays charged its reservation), since the process started.",
			func(st *rule.Stats) int64 { return atomic.LoadInt64(&st.Unreported) }},
	} {
		wrote := false

		for i, l := range layers {
			if !l.Settles {
				continue
			}

			if !wrote {
				family(b, f.name, f.kind, f.help)
				wrote = true
			}

			sample(b, f.name, labels[i], formatInt(f.value(l.Stats)))
		}
	}
}

// inFlightMetrics writes the requests in flight that each concurrency
// layer counts in memory (the memory store, or a Redis instance's memory
// layers and fallback), summed over its keys; labels are the layers'.
func inFlightMetrics(b *strings.Builder, pg *Page, labels []string, now int64) {
	if !pg.Held {
		return
	}

	family(b, "tierlimit_in_flight", "gauge", "Requests in flight that a concurrency layer counts in memory, over its keys.")

	s := pg.Memory
	for i, l := range pg.Layers {
		if l.Algorithm != limit.Concurrency {
			continue
		}

		total := int64(0)

		s.Mu.Lock()
		for _, w := range s.Maps[l.Name] {
			if w.List == l.List {
				total += memstore.HeldAt(w, now)
			}
		}
		s.Mu.Unlock()

		sample(b, "tierlimit_in_flight", labels[i], formatInt(total))
	}
}

// registryMetrics writes the sizes of the process-wide registries, so
// without a middleware label: they follow the current configuration, not
// the history of reloads (../lifetime/lifetime.go). The Redis backends'
// registry is redisstore's; the others are those the root hands over
// (Page.Registries: memstore's stores, redisstore's block lists, the root's
// connection counters).
func registryMetrics(b *strings.Builder, registries []Registry) {
	family(b, "tierlimit_registry_entries", "gauge",
		"Entries in the plugin's process-wide registries: what the current configuration uses, plus what it stopped using in the last 10 seconds or that still holds counts (windows, blocks, open connections).")

	for _, r := range registries {
		sample(b, "tierlimit_registry_entries", `registry="`+r.Name+`"`, strconv.Itoa(r.Entries.Size()))
	}

	sample(b, "tierlimit_registry_entries", `registry="redis"`, strconv.Itoa(redisstore.Backends.ByConfig.Size()))
}

func family(b *strings.Builder, name, kind, help string) {
	b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + kind + "\n")
}

func sample(b *strings.Builder, name, labels, value string) {
	b.WriteString(name + "{" + labels + "} " + value + "\n")
}

func formatInt(n int64) string {
	return strconv.FormatInt(n, 10)
}
