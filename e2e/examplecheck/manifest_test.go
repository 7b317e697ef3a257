package examplecheck

import (
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestManifestSummaryNamesWhatThePluginDoes: the catalog shows .traefik.yml's
// summary, so it names every kind of window a layer takes (fixed, sliding,
// token bucket, calendar quotas), the principal's plans and both stores, not
// fixed windows alone.
func TestManifestSummaryNamesWhatThePluginDoes(t *testing.T) {
	raw, err := os.ReadFile("../../.traefik.yml")
	if err != nil {
		t.Fatal(err)
	}

	var m struct {
		Summary string `yaml:"summary"`
	}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}

	summary := strings.ToLower(m.Summary)
	for _, want := range []string{"fixed", "sliding", "token bucket", "daily", "weekly", "monthly", "plans", "per ip", "principal", "per route", "memory", "redis"} {
		if !strings.Contains(summary, want) {
			t.Errorf(".traefik.yml's summary does not say %q: %s", want, m.Summary)
		}
	}
}
