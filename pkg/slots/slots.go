// Package slots owns the cross-branch check of numbered migrations. A migration N is a
// file named N in a migrations folder; a runner runs slots current..targetVersion-1 and
// stamps targetVersion. When two release branches hold different migrations in the same
// slot, a cluster that takes a patch on the older branch and then upgrades to the newer
// one silently skips the newer branch's migration. Check reads each ref's tree with
// go-git (no checkout, no git binary) and reports such slots.
package slots

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// Options say where the migrations and the targetVersion live.
type Options struct {
	Repo string
	// Refs are branches, tags or commits, oldest release line first.
	Refs []string
	// Dir is the migrations folder in the tree.
	Dir string
	// TargetFile and TargetKey locate targetVersion: a YAML file and a dotted key in it.
	TargetFile, TargetKey string
	// Equivalent maps a slot to the content hashes that are the same change (ports that
	// differ byte-wise, for example only in how they stamp the version).
	Equivalent map[int][]string
}

// OptionEquivalent is Options.Equivalent, as a finding's Input names it: declaring the
// migrations of a slot equivalent resolves a diverged or claimed slot that is one change.
const OptionEquivalent = "slots.Equivalent"

// Ref is what one ref holds.
type Ref struct {
	Ref           string         `json:"ref"`
	Commit        string         `json:"commit"`
	TargetVersion int            `json:"targetVersion"`
	Slots         map[int]string `json:"slots"` // slot -> sha256 of the file
}

// Kind of finding.
type Kind string

const (
	// Diverged means two refs hold different migrations in a slot both have run.
	Diverged Kind = "diverged"
	// Missing means a slot both refs have run exists on only one of them.
	Missing Kind = "missing"
	// Claimed means a maintenance branch's latest targetVersion bump took a slot that a
	// newer branch uses for something else: the patch-then-minor path skips it.
	Claimed Kind = "claimed"
)

// Misalignment is one misaligned slot, reported as a finding.
type Misalignment struct {
	// Finding is the shared shape: Check is the Kind, Subject "slot N", Severity danger
	// (a cluster on the upgrade path skips or repeats a migration).
	finding.Finding
	Slot   int               `json:"slot"`
	Hashes map[string]string `json:"hashes"` // ref -> hash, "" when missing
}

// Kind is the finding's kind (its Check).
func (f Misalignment) Kind() Kind { return Kind(f.Check) }

func newMisalignment(kind Kind, slot int, hashes map[string]string, msg string) Misalignment {
	return Misalignment{Finding: finding.Finding{Check: string(kind), Subject: "slot " + strconv.Itoa(slot), Severity: finding.Danger, Message: msg},
		Slot: slot, Hashes: hashes}
}

// Report is the result of a check.
type Report struct {
	Refs         []Ref          `json:"refs"`
	LowestTarget int            `json:"lowestTargetVersion"`
	Findings     []Misalignment `json:"findings"`
}

// ErrTooFewRefs says a check was asked for fewer than two refs: there is nothing to
// compare.
var ErrTooFewRefs = errors.New("at least two refs are needed to compare")

// Check reads every ref and compares their slots.
func Check(ctx context.Context, o Options) (*Report, error) {
	if len(o.Refs) < 2 {
		return nil, ErrTooFewRefs
	}
	repo, err := OpenRepository(o.Repo)
	if err != nil {
		return nil, err
	}
	rep := &Report{Findings: []Misalignment{}}
	for _, ref := range o.Refs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := readRef(repo, ref, o)
		if err != nil {
			return nil, err
		}
		rep.Refs = append(rep.Refs, *r)
	}
	rep.LowestTarget = rep.Refs[0].TargetVersion
	for _, r := range rep.Refs {
		rep.LowestTarget = min(rep.LowestTarget, r.TargetVersion)
	}
	for slot := range rep.LowestTarget {
		if f, ok := compare(rep.Refs, slot, o.Equivalent); ok {
			rep.Findings = append(rep.Findings, f)
		}
	}
	return rep, nil
}

// OpenRepository opens the repository at path in any of the shapes CI and hooks use: the
// top or a folder of a work tree, a bare repository (git clone --bare), a mirror (git clone
// --mirror) or a linked worktree (git worktree add), whose objects and refs live in the main
// repository's common directory.
func OpenRepository(path string) (*git.Repository, error) {
	// As given first: a bare repository or a mirror has no .git, and looking upwards from
	// it would never find one (or would find an unrelated work tree around it).
	repo, err := git.PlainOpenWithOptions(path, &git.PlainOpenOptions{EnableDotGitCommonDir: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		// A folder inside a work tree: find the .git above it.
		repo, err = git.PlainOpenWithOptions(path, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	}
	if err != nil {
		return nil, fmt.Errorf("open git repository %s (a work tree, a bare clone, a mirror or a linked worktree): %w", path, err)
	}
	return repo, nil
}

func compare(refs []Ref, slot int, equivalent map[int][]string) (Misalignment, bool) {
	hashes := map[string]string{}
	distinct := map[string]bool{}
	missing := false
	for _, r := range refs {
		h := r.Slots[slot]
		hashes[r.Ref] = h
		if h == "" {
			missing = true
		} else {
			distinct[h] = true
		}
	}
	if missing {
		if len(distinct) == 0 {
			return Misalignment{}, false // a slot no ref has (numbering starts later): fine
		}
		return newMisalignment(Missing, slot, hashes, fmt.Sprintf("slot %d exists on %s only; every ref runs it (below targetVersion %d on all): add the same migration to the others", slot, present(refs, slot), lowest(refs))), true
	}
	if len(distinct) == 1 || allEquivalent(distinct, equivalent[slot]) {
		return Misalignment{}, false
	}
	f := newMisalignment(Diverged, slot, hashes, "")
	older := refs[0]
	for _, r := range refs[1:] {
		if r.Slots[slot] != older.Slots[slot] && older.TargetVersion == slot+1 && r.TargetVersion > older.TargetVersion {
			f.Check = string(Claimed)
			f.Message = fmt.Sprintf("%s raised targetVersion to %d, claiming slot %d, which %s uses for a different migration: a cluster that takes the next %s patch is stamped %d, and on upgrading to %s never runs %s's migration %d. Fix: copy %s's migration %d, made idempotent, to slot %d on %s and raise its targetVersion to %d; or declare the two equivalent",
				older.Ref, older.TargetVersion, slot, r.Ref, older.Ref, older.TargetVersion, r.Ref, r.Ref, slot, r.Ref, slot, r.TargetVersion, r.Ref, r.TargetVersion+1)
			f.Input = &finding.Input{Option: OptionEquivalent}
			return f, true
		}
	}
	f.Message = fmt.Sprintf("slot %d holds different migrations on %s: a cluster that moves between them runs only one; align them, or declare them equivalent if they are the same change", slot, strings.Join(refNames(refs), ", "))
	f.Input = &finding.Input{Option: OptionEquivalent}
	return f, true
}

func allEquivalent(distinct map[string]bool, same []string) bool {
	for h := range distinct {
		if !slices.Contains(same, h) {
			return false
		}
	}
	return len(same) > 0
}

func present(refs []Ref, slot int) string {
	var names []string
	for _, r := range refs {
		if r.Slots[slot] != "" {
			names = append(names, r.Ref)
		}
	}
	return strings.Join(names, ", ")
}

func lowest(refs []Ref) int {
	l := refs[0].TargetVersion
	for _, r := range refs {
		l = min(l, r.TargetVersion)
	}
	return l
}

func refNames(refs []Ref) []string {
	out := make([]string, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.Ref)
	}
	return out
}

func readRef(repo *git.Repository, ref string, o Options) (*Ref, error) {
	hash, err := repo.ResolveRevision(plumbing.Revision(ref))
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w (fetch it first, for example `git fetch origin %s`)", ref, err, ref)
	}
	commit, err := repo.CommitObject(*hash)
	if err != nil {
		return nil, fmt.Errorf("read commit %s of %s: %w", hash, ref, err)
	}
	tree, err := commit.Tree()
	if err != nil {
		return nil, err
	}
	r := &Ref{Ref: ref, Commit: hash.String(), Slots: map[int]string{}}
	dir, err := tree.Tree(strings.Trim(o.Dir, "/"))
	if err != nil {
		return nil, fmt.Errorf("%s: no migrations folder %s: %w", ref, o.Dir, err)
	}
	for _, e := range dir.Entries {
		n, err := strconv.Atoi(e.Name)
		if err != nil || !e.Mode.IsFile() {
			continue // not a slot (a README, a helper script)
		}
		f, err := dir.TreeEntryFile(&e)
		if err != nil {
			return nil, err
		}
		sum, err := fileHash(f)
		if err != nil {
			return nil, fmt.Errorf("%s: read %s/%s: %w", ref, o.Dir, e.Name, err)
		}
		r.Slots[n] = sum
	}
	if r.TargetVersion, err = targetVersion(tree, o.TargetFile, o.TargetKey); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return r, nil
}

func fileHash(f *object.File) (string, error) {
	rd, err := f.Reader()
	if err != nil {
		return "", err
	}
	defer func() { _ = rd.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, rd); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func targetVersion(tree *object.Tree, file, key string) (int, error) {
	f, err := tree.File(file)
	if err != nil {
		return 0, fmt.Errorf("no target file %s: %w", file, err)
	}
	content, err := f.Contents()
	if err != nil {
		return 0, err
	}
	var doc any
	if err := yaml.Unmarshal([]byte(content), &doc); err != nil {
		return 0, fmt.Errorf("%s is not YAML: %w", file, err)
	}
	for _, part := range strings.Split(key, ".") {
		m, ok := doc.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("%s has no key %s", file, key)
		}
		if doc, ok = m[part]; !ok {
			return 0, fmt.Errorf("%s has no key %s", file, key)
		}
	}
	switch v := doc.(type) {
	case float64:
		return int(v), nil
	case string:
		return strconv.Atoi(v)
	}
	return 0, fmt.Errorf("%s: %s is %v, not a number", file, key, doc)
}

// LoadEquivalent reads an equivalence file:
//
//	equivalent:
//	  "45": [<sha256>, <sha256>]
func LoadEquivalent(path string) (map[int][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Equivalent map[string][]string `json:"equivalent"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w (expected `equivalent: {\"45\": [sha256, sha256]}`)", path, err)
	}
	out := map[int][]string{}
	for k, v := range doc.Equivalent {
		n, err := strconv.Atoi(k)
		if err != nil {
			return nil, fmt.Errorf("%s: slot %q is not a number", path, k)
		}
		out[n] = v
	}
	return out, nil
}

// FindingReport is the check as CI reads it: a case per slot below the lowest
// targetVersion that some ref holds, with the findings about it.
func (r *Report) FindingReport() finding.Report {
	held := map[int]bool{}
	for _, ref := range r.Refs {
		for s := range ref.Slots {
			if s < r.LowestTarget {
				held[s] = true
			}
		}
	}
	for _, f := range r.Findings {
		held[f.Slot] = true
	}
	rep := finding.Report{Tool: "slots", Cases: []finding.Case{}}
	for _, s := range slices.Sorted(maps.Keys(held)) {
		c := finding.Case{Name: "slot " + strconv.Itoa(s)}
		for _, f := range r.Findings {
			if f.Slot == s {
				c.Findings = append(c.Findings, f.Finding)
			}
		}
		rep.Cases = append(rep.Cases, c)
	}
	return rep
}
