// Command kuport-lab is the local lab's tool. Subcommands:
//
//	serve  the pod server: answers each request with the peer address it saw
//	probe  the client: sends one request and prints what the pod saw and where the reply came from
//	stream the client: sends a request every interval and prints how many replies came back
//	demo   starts the lab, runs the demo scenarios (one SCENARIO line each on stdout), tears down
//	up     starts the lab with the demo's classes and the remote mapping and leaves it running
//	run    the lab supervisor behind up
//	down   stops a lab started by up and removes whatever it left
//
// Exit status: 0 on success, 2 on a usage error, 1 on any other error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/labtool"
)

const usage = "usage: kuport-lab serve|probe|stream|demo|up|down [flags]"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		_, _ = fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "help", "-h", "--help":
		_, _ = fmt.Fprintln(stdout, usage)
		return 0
	case "serve":
		err = labtool.Serve(ctx, args[1:], stdout)
	case "probe":
		err = labtool.Probe(ctx, args[1:], stdout)
	case "stream":
		err = labtool.Stream(ctx, args[1:], stdout)
	case "demo":
		err = lab.Demo(ctx, args[1:], stdout, stderr)
	case "up":
		err = lab.UpDetached(ctx, args[1:], stderr)
	case "run":
		err = lab.Run(ctx, args[1:], stderr)
	case "down":
		err = lab.Down(ctx, args[1:], stderr)
	default:
		_, _ = fmt.Fprintf(stderr, "unknown subcommand %q; %s\n", args[0], usage)
		return 2
	}
	if err == nil {
		return 0
	}
	_, _ = fmt.Fprintf(stderr, "kuport-lab %s: %v\n", args[0], err)
	if errors.Is(err, labtool.ErrUsage) {
		return 2
	}
	return 1
}
