// Command depwhy prints, for each package prefix given, the shortest import chain from a
// main package to the first package under that prefix: what to cut to stop linking it.
//
//	go run ./hack/depwhy ./cmd/upgradeguard k8s.io/apiserver google.golang.org/grpc go.opentelemetry.io
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: depwhy MAIN-PACKAGE PREFIX...")
		os.Exit(2)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", os.Args[1]).Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	imports := map[string][]string{}
	var root string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		imports[f[0]] = f[1:]
		root = f[0] // go list -deps prints the main package last
	}
	for _, prefix := range os.Args[2:] {
		fmt.Printf("%s:\n  %s\n", prefix, strings.Join(chain(imports, root, prefix), "\n  -> "))
	}
}

// chain is a shortest path from root to a package under prefix (breadth first).
func chain(imports map[string][]string, root, prefix string) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if strings.HasPrefix(p, prefix) {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append([]string{p}, path...)
			}
			return path
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return []string{"(not linked)"}
}
