// Command pause is the sandbox (pause) image of a test node (internal/testenv/node): it holds a
// Pod's namespaces and waits for a signal, as registry.k8s.io/pause does. The node has no
// registry to pull that image from, so the harness builds this one and imports it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
