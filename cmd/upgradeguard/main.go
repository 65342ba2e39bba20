// Command upgradeguard makes Helm and Flux upgrades, rollbacks and chart migrations safe.
// See docs/cli.md for the command reference.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/upgradeguard/upgradeguard/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], cli.Streams{Out: os.Stdout, ErrOut: os.Stderr, In: os.Stdin})
	stop()
	os.Exit(code)
}
