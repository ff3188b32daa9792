//go:build tools

// Package controlplane pins the Kubernetes commands that build.sh compiles: the control plane
// every e2e cluster runs, and the node components (kubelet, kube-scheduler, kube-proxy) of the
// consumer cluster that runs kbind's chart as pods.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
