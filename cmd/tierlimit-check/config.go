package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/traefik/traefik/v3/pkg/config/dynamic"
	"github.com/traefik/traefik/v3/pkg/config/label"
	"github.com/traefik/traefik/v3/pkg/provider"
	"github.com/traefik/traefik/v3/pkg/provider/file"
	traefikv1alpha1 "github.com/traefik/traefik/v3/pkg/provider/kubernetes/crd/traefikio/v1alpha1"
	apiextensionv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// middleware is one middleware of the plugin found in a file: its
// qualified name (as Traefik names it, `ratelimit@file`), the plugin alias
// and the configuration map the provider hands Traefik.
type middleware struct {
	name    string
	alias   string
	config  map[string]any
	secrets bool  // holds urn:k8s:secret references (left as written)
	err     error // found before the plugin: Traefik's own error for it
}

// errPluginCount is Traefik's error for a middleware with several plugins
// (pkg/server/middleware: findPluginConfig).
var errPluginCount = errors.New("plugin: invalid configuration: no configuration or too many plugin definition")

// readConfig reads a file's middlewares of the plugin: Kubernetes manifests
// when a YAML document has an apiVersion and a kind, Docker labels when the
// YAML has a top-level labels or services key (and no http, tcp, udp or
// tls), else a Traefik dynamic configuration file.
func readConfig(path string, aliases []string) ([]middleware, error) {
	if !configExt(path) {
		return nil, fmt.Errorf("not a .yml, .yaml or .toml file")
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	if ext := strings.ToLower(filepath.Ext(path)); ext != ".toml" {
		if docs, ok := manifests(raw); ok {
			return fromManifests(docs, aliases)
		}

		if sets, ok := dockerLabels(raw); ok {
			return fromLabels(sets, aliases)
		}
	}

	return fromDynamic(path, aliases)
}

// fromDynamic decodes a dynamic configuration file as Traefik's file
// provider does (its Go template rendered first, then paerser's decoder).
func fromDynamic(path string, aliases []string) ([]middleware, error) {
	p := &file.Provider{Filename: path}

	conf, err := p.CreateConfiguration(context.Background(), path, template.FuncMap{}, false)
	if err != nil {
		return nil, err
	}

	return fromHTTP(conf, "file", aliases), nil
}

// fromHTTP is the plugin's middlewares of a configuration, in name order,
// named `<name>@<provider>`.
func fromHTTP(conf *dynamic.Configuration, prov string, aliases []string) []middleware {
	if conf == nil || conf.HTTP == nil {
		return nil
	}

	names := make([]string, 0, len(conf.HTTP.Middlewares))
	for name := range conf.HTTP.Middlewares {
		names = append(names, name)
	}

	sort.Strings(names)

	var out []middleware

	for _, name := range names {
		if mw := conf.HTTP.Middlewares[name]; mw != nil {
			out = append(out, ofPlugin(name+"@"+prov, mw.Plugin, aliases)...)
		}
	}

	return out
}

// ofPlugin is the middleware of the plugin among a middleware's plugins
// (none when it uses another plugin or none).
func ofPlugin(name string, conf map[string]dynamic.PluginConf, aliases []string) []middleware {
	for _, a := range aliases {
		pc, ok := conf[a]
		if !ok {
			continue
		}

		m := middleware{name: name, alias: a, config: map[string]any(pc)}
		if len(conf) != 1 {
			m.err = errPluginCount
		}

		return []middleware{m}
	}

	return nil
}

// manifests splits YAML into documents converted to JSON, as kubectl does;
// ok when one of them is a Kubernetes object (apiVersion and kind).
func manifests(raw []byte) ([][]byte, bool) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	found := false

	var docs [][]byte

	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, found
		}

		if err != nil {
			return nil, false
		}

		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, false
		}

		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}

		if json.Unmarshal(j, &head) == nil && head.APIVersion != "" && head.Kind != "" {
			found = true
		}

		docs = append(docs, j)
	}
}

// fromManifests reads the Middleware objects of traefik.io/v1alpha1 as
// Traefik's CRD provider does: spec.plugin through JSON (numbers are
// float64), named `<namespace>-<name>@kubernetescrd`.
func fromManifests(docs [][]byte, aliases []string) ([]middleware, error) {
	var out []middleware

	for i, doc := range docs {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}

		if json.Unmarshal(doc, &head) != nil || head.APIVersion != traefikv1alpha1.SchemeGroupVersion.String() || head.Kind != "Middleware" {
			continue
		}

		var mw traefikv1alpha1.Middleware
		if err := json.Unmarshal(doc, &mw); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}

		ns := mw.Namespace
		if ns == "" {
			ns = "default"
		}

		confs, err := pluginConfs(mw.Spec.Plugin)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, mw.Name, err)
		}

		for _, m := range ofPlugin(provider.Normalize(ns+"-"+mw.Name)+"@kubernetescrd", confs, aliases) {
			m.secrets, m.err = secretRefs(m.config, m.err)
			out = append(out, m)
		}
	}

	return out, nil
}

// pluginConfs is the CRD provider's createPluginMiddleware without the
// Secrets: spec.plugin marshalled and read back into plugin configurations.
func pluginConfs(spec map[string]apiextensionv1.JSON) (map[string]dynamic.PluginConf, error) {
	if spec == nil {
		return nil, nil
	}

	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}

	confs := map[string]dynamic.PluginConf{}
	if err := json.Unmarshal(data, &confs); err != nil {
		return nil, err
	}

	return confs, nil
}

// secretRefs reports whether a configuration holds urn:k8s:secret values,
// and Traefik's error for one that is not urn:k8s:secret:<secret>:<key>
// (err, Traefik's error so far, wins).
func secretRefs(v any, err error) (bool, error) {
	found := false

	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			if !strings.HasPrefix(x, "urn:k8s:secret:") {
				return
			}

			found = true

			if err == nil && len(strings.Split(x, ":")) != 5 {
				err = fmt.Errorf("plugin: malformed secret URN %q", x)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}

	walk(v)

	return found, err
}

// labelSet is the labels of one container: a Compose service's, or a file
// holding a list of labels alone (examples/docker/labels.yml).
type labelSet struct {
	service string
	labels  map[string]string
}

// dockerLabels reads Docker labels from a Compose file (services.<name>.labels)
// or a file of labels alone (a top-level labels list or map); ok when the
// file is one of those and not a dynamic configuration.
func dockerLabels(raw []byte) ([]labelSet, bool) {
	var top map[string]any
	if yaml.Unmarshal(raw, &top) != nil {
		return nil, false
	}

	for _, k := range []string{"http", "tcp", "udp", "tls"} {
		if _, ok := top[k]; ok {
			return nil, false
		}
	}

	if l, ok := top["labels"]; ok {
		return []labelSet{{service: "labels", labels: labelMap(l)}}, true
	}

	services, ok := top["services"].(map[string]any)
	if !ok {
		return nil, false
	}

	var sets []labelSet

	for name, svc := range services {
		if m, isMap := svc.(map[string]any); isMap && m["labels"] != nil {
			sets = append(sets, labelSet{service: name, labels: labelMap(m["labels"])})
		}
	}

	sort.Slice(sets, func(i, j int) bool { return sets[i].service < sets[j].service })

	return sets, true
}

// labelMap is Compose's labels in either form: a list of key=value or a map.
func labelMap(v any) map[string]string {
	out := map[string]string{}

	switch x := v.(type) {
	case []any:
		for _, e := range x {
			k, val, _ := strings.Cut(fmt.Sprint(e), "=")
			out[k] = val
		}
	case map[string]any:
		for k, e := range x {
			out[k] = fmt.Sprint(e)
		}
	}

	return out
}

// fromLabels decodes each container's labels with Traefik's label parser, as
// its Docker provider does; its middlewares are named `<name>@docker`.
func fromLabels(sets []labelSet, aliases []string) ([]middleware, error) {
	var out []middleware

	for _, s := range sets {
		conf, err := label.DecodeConfiguration(s.labels)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.service, err)
		}

		out = append(out, fromHTTP(conf, "docker", aliases)...)
	}

	return out, nil
}
