//go:build !linux

package childproc

import "os/exec"

// Tie does nothing here: only Linux has a parent-death signal.
func Tie(*exec.Cmd) {}

// TieGroup does nothing here: only Linux has a parent-death signal.
func TieGroup(*exec.Cmd) {}

// TiedPath returns bin: only Linux has a parent-death signal.
func TiedPath(_, bin string) (string, error) { return bin, nil }
