// Command sluice is the sluice rate limiter: `sluice serve` answers Envoy's
// gRPC rate limit API and an HTTP JSON API from a rules file, `sluice check`
// validates rules files, `sluice bench` loads a running server, and
// `sluice version` prints the version; `sluice help COMMAND` says how to
// use each, with examples and its flags by group.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGHUP first, before anything else runs: unhandled, it ends the
	// process (exit status 129, without a word). serve and proxy reload on
	// it; the other commands ignore it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(withReloads(context.Background(), hup), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, commandArgs(os.Args), os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "sluice:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(1)
	}
}
