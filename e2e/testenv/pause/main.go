// The pod sandbox ("pause") image's binary for the real node of scripts/k8s-testenv.sh:
// it holds the pod's namespaces and does nothing until SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of the pod, reap any child the runtime leaves to it.
	signal.Ignore(syscall.SIGCHLD)
	<-stop
}
