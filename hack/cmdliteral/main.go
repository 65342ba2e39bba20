// Command cmdliteral refuses command literals outside pkg/cmdline: a string literal in
// product code that words a kubectl, helm, flux, argocd or upgradeguard command a person
// is told to run. Every such command is a value of package cmdline, built by one
// constructor and worded in one place, so that every door names the same command for the
// same step. depguard keeps the layers; this keeps the commands.
//
// A literal words a command when it holds a tool and one of its subcommands (kubectl
// annotate, helm rollback, upgradeguard migrate...) and the tool is kubectl or flux (whose
// subcommands are not prose), or the subcommand follows a backquote or "run ", or an
// argument follows it (a flag, a format verb, a placeholder in capitals, a path), or
// nothing does (the literal, a quote or a parenthesis ends there). Prose that names a
// tool's operation ("helm uninstall reads the stored manifest") passes.
//
// Test files, hack/, test/, examples/ (a program of the library's users) and pkg/cmdline
// are not read, nor the help text of the CLI's commands and flags (constants named ...Long
// or ...Example, the Short, Long and Example fields of a cobra.Command, and a flag's usage:
// the last argument of pflag's StringVar, BoolVarP...), which documents usage.
//
//	go run ./hack/cmdliteral .
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// subcommands are, per tool, the subcommands (and two-word subcommands) that make a
// command.
var subcommands = map[string][]string{
	"kubectl":      {"annotate", "apply", "create", "delete", "describe", "edit", "get", "label", "logs", "patch", "wait", "-n"},
	"helm":         {"dependency build", "get manifest", "history", "install", "lint", "list", "registry login", "rollback", "template", "uninstall", "upgrade", "version"},
	"flux":         {"get", "reconcile", "resume", "suspend"},
	"argocd":       {"app delete", "app manifests", "app rollback", "app set", "app sync", "repo add"},
	"upgradeguard": {"apf", "audit", "check", "crd backup", "crd restore", "migrate", "plan", "rbac", "release apply-check", "release uninstall-check", "snapshot"},
}

// skipped are the directories that are not product code.
var skipped = []string{"hack", "test", "pkg/cmdline", "vendor", "testdata", "bin", "examples"}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cmdliteral ROOT")
		os.Exit(2)
	}
	found, err := check(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, f := range found {
		fmt.Println(f)
	}
	if len(found) > 0 {
		fmt.Printf("%d command literal(s) outside pkg/cmdline: build the command with a constructor of package cmdline (github.com/upgradeguard/upgradeguard/pkg/cmdline) and use its String\n", len(found))
		os.Exit(1)
	}
}

// check reads every product Go file under root and returns one line per command literal.
func check(root string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			for _, s := range skipped {
				if rel == s || strings.HasPrefix(d.Name(), ".") && rel != "." {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		got, err := file(path, rel)
		found = append(found, got...)
		return err
	})
	return found, err
}

// file returns the command literals of one file.
func file(path, rel string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	help := map[*ast.BasicLit]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ImportSpec:
			help[n.Path] = true
		case *ast.Field:
			if n.Tag != nil {
				help[n.Tag] = true
			}
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if (strings.HasSuffix(name.Name, "Long") || strings.HasSuffix(name.Name, "Example")) && i < len(n.Values) {
					markLits(n.Values[i], help)
				}
			}
		case *ast.CallExpr:
			// A flag's usage, the last argument of pflag's StringVar, BoolVarP...
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && len(n.Args) > 0 && (strings.HasSuffix(sel.Sel.Name, "Var") || strings.HasSuffix(sel.Sel.Name, "VarP")) {
				markLits(n.Args[len(n.Args)-1], help)
			}
		case *ast.KeyValueExpr:
			if k, ok := n.Key.(*ast.Ident); ok && (k.Name == "Short" || k.Name == "Long" || k.Name == "Example") {
				markLits(n.Value, help)
			}
		}
		return true
	})
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || help[lit] {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		if cmd := command(s); cmd != "" {
			out = append(out, fmt.Sprintf("%s:%d: %q words a command (%s)", rel, fset.Position(lit.Pos()).Line, s, cmd))
		}
		return true
	})
	return out, nil
}

func markLits(e ast.Expr, into map[*ast.BasicLit]bool) {
	ast.Inspect(e, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok {
			into[lit] = true
		}
		return true
	})
}

// command returns the first command s words ("kubectl annotate"), or "".
func command(s string) string {
	for i := 0; i < len(s); i++ {
		if i > 0 && wordByte(s[i-1]) {
			continue
		}
		for tool, subs := range subcommands {
			rest, ok := strings.CutPrefix(s[i:], tool+" ")
			if !ok {
				continue
			}
			for _, sub := range subs {
				after, ok := strings.CutPrefix(rest, sub)
				if !ok || after != "" && wordByte(after[0]) && after[0] != '-' || strings.HasPrefix(after, "-") {
					continue
				}
				prefix := s[:i]
				if tool == "kubectl" || tool == "flux" || strings.HasSuffix(prefix, "`") || strings.HasSuffix(prefix, "run ") || argument(after) {
					return tool + " " + sub
				}
			}
		}
	}
	return ""
}

// argument reports whether what follows a subcommand is an argument or the end of the
// command.
func argument(after string) bool {
	if strings.TrimSpace(after) == "" {
		return true // the literal ends with the command: its arguments follow
	}
	if strings.HasPrefix(after, "'s ") {
		return false // a possessive: "upgradeguard migrate's writes"
	}
	if strings.ContainsRune(")`'\"|;,", rune(after[0])) {
		return true
	}
	next, _, _ := strings.Cut(strings.TrimPrefix(after, " "), " ")
	if after[0] != ' ' || next == "" {
		return false
	}
	c := next[0]
	return c == '-' || c == '%' || c == '<' || c >= 'A' && c <= 'Z' || strings.ContainsAny(next, "/.=")
}

func wordByte(c byte) bool {
	return c == '_' || c == '-' || c == '.' || c == '/' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
