package examplecheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// helmChart is the traefik/traefik chart whose values examples/kubernetes/helm-values.yaml
// is written for: the Go module proxy serves the chart's repository at this tag.
const helmChart = "github.com/traefik/traefik-helm-chart@v41.6.0+incompatible"

// TestKubernetesGatewayExample: examples/kubernetes/gateway.yaml decodes
// strictly into Gateway API v1's HTTPRoute, in chain.yaml's namespace; its
// ExtensionRef filters name Middlewares of chain.yaml, its backends Services
// and ports of chain.yaml, its parent the Gateway of the Helm chart's values.
func TestKubernetesGatewayExample(t *testing.T) {
	m := decodeManifests(t, "examples/kubernetes/chain.yaml")
	ns := m.namespaces[0].Name

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "kubernetes", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	var route gatewayv1.HTTPRoute
	if err := yaml.UnmarshalStrict(raw, &route); err != nil {
		t.Fatalf("gateway.yaml: %v", err)
	}

	if route.APIVersion != "gateway.networking.k8s.io/v1" || route.Kind != "HTTPRoute" || route.Namespace != ns {
		t.Fatalf("gateway.yaml: %s %s in %q, want an HTTPRoute of gateway.networking.k8s.io/v1 in %s", route.APIVersion, route.Kind, route.Namespace, ns)
	}

	for _, p := range route.Spec.ParentRefs {
		if p.Name != "traefik-gateway" || p.Namespace == nil || *p.Namespace != "traefik" || p.SectionName == nil || *p.SectionName != "web" {
			t.Errorf("parentRef %+v: want the chart's Gateway traefik-gateway in namespace traefik, listener web", p)
		}
	}

	filters := 0

	for _, rule := range route.Spec.Rules {
		for _, f := range rule.Filters {
			if f.Type != gatewayv1.HTTPRouteFilterExtensionRef || f.ExtensionRef == nil {
				continue
			}

			filters++

			ref := f.ExtensionRef
			if _, ok := m.middlewares[string(ref.Name)]; ref.Group != "traefik.io" || ref.Kind != "Middleware" || !ok {
				t.Errorf("ExtensionRef %+v: want group traefik.io, kind Middleware, a Middleware of chain.yaml", *ref)
			}
		}

		for _, b := range rule.BackendRefs {
			if b.Port == nil || (b.Kind != nil && *b.Kind != "Service") {
				t.Errorf("backendRef %+v: want a Service with a port", b)
				continue
			}

			checkServicePort(t, m, "HTTPRoute backendRef", string(b.Name), int(*b.Port))
		}
	}

	if filters == 0 {
		t.Error("gateway.yaml has no ExtensionRef filter")
	}
}

// TestHelmValues: examples/kubernetes/helm-values.yaml passes the chart's own
// values.schema.json (top-level and most sections reject unknown keys), and
// what the schema leaves free-form is checked against the chart's templates
// and this repository: the local plugin of type localPath names the module
// and a volume of deployment.additionalVolumes, mounted where Traefik looks
// for it; the projected ConfigMaps list exactly the sub-packages' files.
func TestHelmValues(t *testing.T) {
	chart := filepath.Join(chartDir(t), "traefik")
	values := helmValues(t)

	schemaFile, err := os.Open(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer schemaFile.Close()

	schemaDoc, err := jsonschema.UnmarshalJSON(schemaFile)
	if err != nil {
		t.Fatal(err)
	}

	c := jsonschema.NewCompiler()
	if err := c.AddResource("values.schema.json", schemaDoc); err != nil {
		t.Fatal(err)
	}

	schema, err := c.Compile("values.schema.json")
	if err != nil {
		t.Fatal(err)
	}

	if err := schema.Validate(values.raw); err != nil {
		t.Fatalf("helm-values.yaml against the chart's values.schema.json: %v", err)
	}

	// The keys the chart's templates read from a localPath plugin.
	tpl := readAll(t, filepath.Join(chart, "templates", "_helpers.tpl"), filepath.Join(chart, "templates", "_podtemplate.tpl"))
	for _, s := range []string{`eq $plugin.type "localPath"`, "$localPathConfig.volumeName", "$localPlugin.mountPath", "$localPlugin.moduleName"} {
		if !strings.Contains(tpl, s) {
			t.Errorf("the chart's templates no longer read %s", s)
		}
	}

	p := values.Experimental.LocalPlugins["tierlimit"]
	if p.ModuleName != harness.ModuleName || p.Type != "localPath" || p.MountPath != "/plugins-local/src/"+harness.ModuleName {
		t.Errorf("localPlugins.tierlimit %+v: want moduleName %s, type localPath, mountPath /plugins-local/src/<moduleName>", p, harness.ModuleName)
	}

	checkPluginVolume(t, values, p.VolumeName)

	if l := values.Gateway.Listeners["web"]; l.NamespacePolicy.From != "All" {
		t.Errorf("gateway.listeners.web.namespacePolicy %+v: gateway.yaml's route lives in another namespace than Traefik", l.NamespacePolicy)
	}
}

type helmValuesFile struct {
	raw          any
	Experimental struct {
		LocalPlugins map[string]struct {
			ModuleName string `json:"moduleName"`
			Type       string `json:"type"`
			VolumeName string `json:"volumeName"`
			MountPath  string `json:"mountPath"`
		} `json:"localPlugins"`
	} `json:"experimental"`
	Deployment struct {
		AdditionalVolumes []struct {
			Name      string `json:"name"`
			Projected struct {
				Sources []struct {
					ConfigMap struct {
						Name  string `json:"name"`
						Items []struct {
							Key  string `json:"key"`
							Path string `json:"path"`
						} `json:"items"`
					} `json:"configMap"`
				} `json:"sources"`
			} `json:"projected"`
		} `json:"additionalVolumes"`
	} `json:"deployment"`
	Gateway struct {
		Listeners map[string]struct {
			NamespacePolicy struct {
				From string `json:"from"`
			} `json:"namespacePolicy"`
		} `json:"listeners"`
	} `json:"gateway"`
}

func helmValues(t *testing.T) helmValuesFile {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "kubernetes", "helm-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	j, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}

	var v helmValuesFile
	if err := json.Unmarshal(j, &v); err != nil {
		t.Fatal(err)
	}

	if v.raw, err = jsonschema.UnmarshalJSON(bytes.NewReader(j)); err != nil {
		t.Fatal(err)
	}

	return v
}

// checkPluginVolume: the volume is projected from the root ConfigMap (every
// key at the top) and one ConfigMap per sub-package of the plugin, named
// tierlimit-plugin-<package>, placing exactly that package's non-test Go
// files under its directory.
func checkPluginVolume(t *testing.T, v helmValuesFile, name string) {
	t.Helper()

	pkgs, err := harness.PluginSubPackages()
	if err != nil {
		t.Fatal(err)
	}

	for _, vol := range v.Deployment.AdditionalVolumes {
		if vol.Name != name {
			continue
		}

		placed := map[string][]string{}

		for _, s := range vol.Projected.Sources {
			if s.ConfigMap.Name == "tierlimit-plugin" && len(s.ConfigMap.Items) == 0 {
				continue
			}

			pkg := strings.TrimPrefix(s.ConfigMap.Name, "tierlimit-plugin-")
			for _, it := range s.ConfigMap.Items {
				if it.Path != pkg+"/"+it.Key {
					t.Errorf("ConfigMap %s item %+v: want path %s/<key>", s.ConfigMap.Name, it, pkg)
				}

				placed[pkg] = append(placed[pkg], it.Key)
			}

			sort.Strings(placed[pkg])
		}

		if fmt.Sprint(placed) != fmt.Sprint(pkgs) || len(vol.Projected.Sources) != len(pkgs)+1 {
			t.Errorf("volume %s: %d sources placing %v, want the root ConfigMap and one per package placing %v", name, len(vol.Projected.Sources), placed, pkgs)
		}

		return
	}

	t.Errorf("deployment.additionalVolumes has no volume %q (localPlugins.tierlimit.volumeName)", name)
}

// chartDir downloads the chart's repository from the Go module proxy (once: the module cache keeps it).
func chartDir(t *testing.T) string {
	t.Helper()

	cmd := exec.Command("go", "mod", "download", "-json", helmChart)
	cmd.Dir = harness.E2EDir()

	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", helmChart, err, out)
	}

	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", helmChart, err, out)
	}

	return info.Dir
}

func readAll(t *testing.T, files ...string) string {
	t.Helper()

	var b strings.Builder

	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}

		b.Write(data)
	}

	return b.String()
}
