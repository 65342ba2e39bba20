// Command etcd is the real etcd server, built from the Go module proxy so that
// tests and the demo run against the same storage the API server uses in production.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
