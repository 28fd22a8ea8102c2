// Command pause is the test clusters' pod sandbox: it holds a pod's
// namespaces and waits to be stopped.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
