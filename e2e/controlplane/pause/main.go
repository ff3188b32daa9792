// Command pause is the test node's pod sandbox image (containerd's `sandbox_image`): it holds a
// pod's namespaces, reaps orphaned children and exits on SIGINT or SIGTERM — what
// registry.k8s.io/pause does, built here because the test node has no registry to pull from.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
