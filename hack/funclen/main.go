// Command funclen measures function length: for each package directory given, the
// number of functions, the median and the longest, counting the lines of each function
// declaration (and method) from its `func` line to its closing brace. Test files and
// generated files are skipped. With -over N it lists the functions longer than N lines.
//
//	go run ./hack/funclen internal/cli pkg/...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type fn struct {
	name  string
	pos   string
	lines int
}

func main() {
	over := flag.Int("over", 0, "list the functions longer than this many lines")
	flag.Parse()
	for _, arg := range flag.Args() {
		fns, err := measure(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		report(arg, fns, *over)
	}
}

// measure reads dir, or every directory under it for a trailing /...
func measure(arg string) ([]fn, error) {
	root, recursive := strings.CutSuffix(arg, "/...")
	var fns []fn
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && !recursive {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
			return nil
		}
		got, err := file(path)
		fns = append(fns, got...)
		return err
	})
	return fns, err
}

func file(path string) ([]fn, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []fn
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) > 0 {
			name = recv(fd.Recv.List[0].Type) + "." + name
		}
		out = append(out, fn{name: name, pos: fmt.Sprintf("%s:%d", path, start.Line), lines: end.Line - start.Line + 1})
	}
	return out, nil
}

func recv(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recv(t.X)
	case *ast.IndexExpr:
		return recv(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

func report(arg string, fns []fn, over int) {
	if len(fns) == 0 {
		fmt.Printf("%s: no functions\n", arg)
		return
	}
	slices.SortFunc(fns, func(a, b fn) int { return b.lines - a.lines })
	lines := make([]int, len(fns))
	for i, f := range fns {
		lines[i] = f.lines
	}
	slices.Sort(lines)
	n := len(lines)
	median := float64(lines[n/2])
	if n%2 == 0 {
		median = float64(lines[n/2-1]+lines[n/2]) / 2
	}
	fmt.Printf("%s: %d functions, median %.1f lines, longest %d (%s %s)\n", arg, n, median, fns[0].lines, fns[0].name, fns[0].pos)
	if over > 0 {
		for _, f := range fns {
			if f.lines > over {
				fmt.Printf("  %4d  %s  %s\n", f.lines, f.name, f.pos)
			}
		}
	}
}
