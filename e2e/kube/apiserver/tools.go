//go:build tools

// Package apiserver pins the kube-apiserver that the Kubernetes e2e test runs
// (make kube builds it into e2e/.cache).
package apiserver

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
