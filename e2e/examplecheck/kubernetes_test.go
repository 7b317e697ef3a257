package examplecheck

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traefik/traefik/v3/pkg/provider/kubernetes/crd/traefikio/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

const clusterDomain = ".svc.cluster.local"

// manifests is examples/kubernetes/chain.yaml decoded strictly: an unknown
// or misspelt field anywhere in an object is an error, as `kubectl apply`
// (server-side field validation) and Traefik's CRD schemas would make it.
type manifests struct {
	namespaces  []corev1.Namespace
	secrets     map[string]corev1.Secret
	deployments []appsv1.Deployment
	services    map[string]corev1.Service
	middlewares map[string]v1alpha1.Middleware
	routes      []v1alpha1.IngressRoute
	namespaced  []string // kind/name of every namespaced object, with its namespace
}

func decodeManifests(t *testing.T, rel string) manifests {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}

	m := manifests{
		secrets:     map[string]corev1.Secret{},
		services:    map[string]corev1.Service{},
		middlewares: map[string]v1alpha1.Middleware{},
	}

	for i, doc := range strings.Split("\n"+string(raw), "\n---\n") {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}

		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s document %d: %v", rel, i+1, err)
		}

		var obj interface{}

		switch head.APIVersion + " " + head.Kind {
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "traefik.io/v1alpha1 Middleware":
			obj = &v1alpha1.Middleware{}
		case "traefik.io/v1alpha1 IngressRoute":
			obj = &v1alpha1.IngressRoute{}
		default:
			t.Fatalf("%s document %d: unexpected %q %q", rel, i+1, head.APIVersion, head.Kind)
		}

		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s document %d (%s): %v", rel, i+1, head.Kind, err)
		}

		switch o := obj.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, *o)
		case *corev1.Secret:
			m.secrets[o.Name] = *o
			m.namespaced = append(m.namespaced, "Secret/"+o.Name+" in "+o.Namespace)
		case *corev1.Service:
			m.services[o.Name] = *o
			m.namespaced = append(m.namespaced, "Service/"+o.Name+" in "+o.Namespace)
		case *appsv1.Deployment:
			m.deployments = append(m.deployments, *o)
			m.namespaced = append(m.namespaced, "Deployment/"+o.Name+" in "+o.Namespace)
		case *v1alpha1.Middleware:
			m.middlewares[o.Name] = *o
			m.namespaced = append(m.namespaced, "Middleware/"+o.Name+" in "+o.Namespace)
		case *v1alpha1.IngressRoute:
			m.routes = append(m.routes, *o)
			m.namespaced = append(m.namespaced, "IngressRoute/"+o.Name+" in "+o.Namespace)
		}
	}

	return m
}

// TestKubernetesExampleApplies: examples/kubernetes/chain.yaml decodes strictly
// into the Kubernetes API types and Traefik v3.6.12's CRD types, and everything
// it refers to is in it: one namespace, a Service (with the port) for every
// address Traefik dials, a Deployment behind every Service, the Secret and key
// behind every urn:k8s:secret: reference.
func TestKubernetesExampleApplies(t *testing.T) {
	m := decodeManifests(t, "examples/kubernetes/chain.yaml")

	if len(m.namespaces) != 1 {
		t.Fatalf("%d Namespaces, want one", len(m.namespaces))
	}

	ns := m.namespaces[0].Name
	for _, o := range m.namespaced {
		if !strings.HasSuffix(o, " in "+ns) {
			t.Errorf("%s: want namespace %s", o, ns)
		}
	}

	for _, want := range []string{"redis", "auth", "whoami"} {
		if _, ok := m.services[want]; !ok {
			t.Errorf("no Service %s", want)
		}
	}

	for name, svc := range m.services {
		checkServiceBackedByDeployment(t, name, svc, m.deployments)
	}

	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
					checkSecretKey(t, m, "Deployment/"+d.Name+" env "+e.Name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
				}
			}
		}
	}

	dialled := 0
	planHeaders := kubernetesPlanHeaders(t, m)

	if len(planHeaders) == 0 {
		t.Error("examples/kubernetes sets no principal.planHeader")
	}

	for name, mw := range m.middlewares {
		if fa := mw.Spec.ForwardAuth; fa != nil {
			u, err := url.Parse(fa.Address)
			if err != nil {
				t.Fatalf("Middleware/%s forwardAuth.address: %v", name, err)
			}

			checkClusterAddress(t, m, ns, "Middleware/"+name+" forwardAuth.address", u.Host)
			checkAuthResponseHeaders(t, "examples/kubernetes Middleware/"+name, fa.AuthResponseHeaders, planHeaders...)

			dialled++
		}

		for plugin, conf := range mw.Spec.Plugin {
			var settings map[string]interface{}
			if err := json.Unmarshal(conf.Raw, &settings); err != nil {
				t.Fatalf("Middleware/%s plugin %s: %v", name, plugin, err)
			}

			redis, _ := settings["redis"].(map[string]interface{})
			addr, _ := redis["address"].(string)
			checkClusterAddress(t, m, ns, "Middleware/"+name+" redis.address", addr)

			pw, _ := redis["password"].(string)
			parts := strings.Split(pw, ":")
			if len(parts) != 5 || !strings.HasPrefix(pw, "urn:k8s:secret:") {
				t.Errorf("Middleware/%s redis.password = %q: want urn:k8s:secret:<secret>:<key>", name, pw)
			} else {
				checkSecretKey(t, m, "Middleware/"+name+" redis.password", parts[3], parts[4])
			}

			dialled++
		}
	}

	if dialled != 3 {
		t.Errorf("%d middlewares dial a service, want the two plugin instances and forwardAuth", dialled)
	}

	if len(m.routes) != 1 {
		t.Fatalf("%d IngressRoutes, want one", len(m.routes))
	}

	for _, r := range m.routes[0].Spec.Routes {
		for _, ref := range r.Middlewares {
			if _, ok := m.middlewares[ref.Name]; !ok || (ref.Namespace != "" && ref.Namespace != ns) {
				t.Errorf("IngressRoute middleware %+v: no such Middleware in %s", ref, ns)
			}
		}

		for _, s := range r.Services {
			checkServicePort(t, m, "IngressRoute service "+s.Name, s.Name, s.Port.IntValue())
		}
	}
}

// checkClusterAddress: Traefik dials host from its own namespace, so it must be
// <service>.<ns>.svc.cluster.local:<port> of a Service of the example.
func checkClusterAddress(t *testing.T, m manifests, ns, where, hostport string) {
	t.Helper()

	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Errorf("%s = %q: %v", where, hostport, err)
		return
	}

	svc, ok := strings.CutSuffix(host, "."+ns+clusterDomain)
	if !ok || strings.Contains(svc, ".") {
		t.Errorf("%s = %q: want <service>.%s%s, which resolves from Traefik's namespace", where, hostport, ns, clusterDomain)
		return
	}

	var p int
	if _, err := fmt.Sscan(port, &p); err != nil {
		t.Errorf("%s = %q: port: %v", where, hostport, err)
		return
	}

	checkServicePort(t, m, where, svc, p)
}

func checkServicePort(t *testing.T, m manifests, where, name string, port int) {
	t.Helper()

	svc, ok := m.services[name]
	if !ok {
		t.Errorf("%s: no Service %s", where, name)
		return
	}

	for _, p := range svc.Spec.Ports {
		if int(p.Port) == port {
			return
		}
	}

	t.Errorf("%s: Service %s has no port %d", where, name, port)
}

func checkSecretKey(t *testing.T, m manifests, where, name, key string) {
	t.Helper()

	s, ok := m.secrets[name]
	if !ok {
		t.Errorf("%s: no Secret %s", where, name)
		return
	}

	if _, ok := s.StringData[key]; !ok {
		if _, ok := s.Data[key]; !ok {
			t.Errorf("%s: Secret %s has no key %s", where, name, key)
		}
	}
}

// checkServiceBackedByDeployment: the Service's selector picks a Deployment's
// pods, whose containers expose every named targetPort.
func checkServiceBackedByDeployment(t *testing.T, name string, svc corev1.Service, deployments []appsv1.Deployment) {
	t.Helper()

	for _, d := range deployments {
		if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			continue
		}

		if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("Deployment/%s: its selector does not match its pods", d.Name)
		}

		for _, p := range svc.Spec.Ports {
			if !containerPort(d, p.TargetPort.String()) {
				t.Errorf("Service/%s targetPort %s: no such container port in Deployment/%s", name, p.TargetPort.String(), d.Name)
			}
		}

		return
	}

	t.Errorf("Service/%s selects no Deployment's pods", name)
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}

	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}

	return true
}

func containerPort(d appsv1.Deployment, port string) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
				return true
			}
		}
	}

	return false
}

// kubernetesPlanHeaders lists the principal.planHeader of every plugin
// Middleware that sets one.
func kubernetesPlanHeaders(t *testing.T, m manifests) []string {
	t.Helper()

	var out []string

	for name, mw := range m.middlewares {
		for plugin, conf := range mw.Spec.Plugin {
			var settings struct {
				Principal struct {
					PlanHeader string `json:"planHeader"`
				} `json:"principal"`
			}

			if err := json.Unmarshal(conf.Raw, &settings); err != nil {
				t.Fatalf("Middleware/%s plugin %s: %v", name, plugin, err)
			}

			if settings.Principal.PlanHeader != "" {
				out = append(out, settings.Principal.PlanHeader)
			}
		}
	}

	return out
}
