//go:build tools

// Package controlplane pins the Kubernetes commands that build.sh compiles.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
