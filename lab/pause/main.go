// Command pause is the lab's sandbox image (kuport.lab/pause:1, containerd's sandbox_image):
// it blocks until SIGTERM or SIGINT and exits 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
