package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/upgradeguard/upgradeguard/internal/childproc"
)

// Platform is an os/arch pair, as GOOS and GOARCH spell it.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// exe is the executable file name on p.
func (p Platform) exe(name string) string {
	if p.OS == "windows" {
		return name + ".exe"
	}
	return name
}

var (
	// ReleasePlatforms are the archives `make dist` ships.
	ReleasePlatforms = []Platform{
		{"linux", "amd64"}, {"linux", "arm64"},
		{"darwin", "amd64"}, {"darwin", "arm64"},
		{"windows", "amd64"}, {"windows", "arm64"},
	}
	// ImagePlatforms are the platforms of the container image index.
	ImagePlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}
)

// Release identifies what is being built.
type Release struct {
	// Version is a semantic version with a leading v: the tag on HEAD, or a Go
	// pseudo-version (v0.0.0-YYYYMMDDHHMMSS-abcdefabcdef) of an untagged commit.
	Version string
	// Commit is the full commit hash.
	Commit string
	// Date is the commit time (or SOURCE_DATE_EPOCH): every timestamp in every artefact.
	Date time.Time
	// Root is the repository root.
	Root string
}

// Tag is the image tag and the version in file names: Version without the leading v,
// with "+" (not allowed in a tag) spelled "_". The chart's appVersion is this tag.
func (r Release) Tag() string {
	return strings.ReplaceAll(strings.TrimPrefix(r.Version, "v"), "+", "_")
}

var semverRE = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// currentRelease reads the version, commit and date of HEAD.
func currentRelease(ctx context.Context, root, version string) (Release, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
			}
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	line, err := git("log", "-1", "--format=%H %ct")
	if err != nil {
		return Release{}, fmt.Errorf("read HEAD (the release is stamped with its commit): %w", err)
	}
	commit, ct, _ := strings.Cut(line, " ")
	secs, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return Release{}, fmt.Errorf("commit time %q: %w", ct, err)
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if secs, err = strconv.ParseInt(s, 10, 64); err != nil {
			return Release{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds: %w", s, err)
		}
	}
	date := time.Unix(secs, 0).UTC()
	if version == "" {
		if tag, err := git("describe", "--tags", "--exact-match", "--match", "v*", "HEAD"); err == nil {
			version = tag
		} else {
			version = fmt.Sprintf("v0.0.0-%s-%s", date.Format("20060102150405"), commit[:12])
		}
	}
	if !semverRE.MatchString(version) {
		return Release{}, fmt.Errorf("version %q is not a semantic version with a leading v (e.g. v1.2.3): krew and Helm require one", version)
	}
	return Release{Version: version, Commit: commit, Date: date, Root: root}, nil
}

// ldflags stamps the version command (internal/cli.Version, Commit, BuildDate).
func (r Release) ldflags() string {
	const pkg = "github.com/upgradeguard/upgradeguard/internal/cli"
	return fmt.Sprintf("-s -w -X %s.Version=%s -X %s.Commit=%s -X %s.BuildDate=%s",
		pkg, r.Version, pkg, r.Commit, pkg, r.Date.Format(time.RFC3339))
}

// BuildBinary cross-compiles cmd/upgradeguard for p into dir/<os>_<arch>/: static (CGO
// off), with paths trimmed, so that the bytes depend only on the source and the Go
// version.
func BuildBinary(ctx context.Context, r Release, p Platform, dir string) (string, error) {
	out := filepath.Join(dir, p.OS+"_"+p.Arch, p.exe("upgradeguard"))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", r.ldflags(), "-o", out, "./cmd/upgradeguard")
	cmd.Dir = r.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch, "GOFLAGS=")
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	// Killed with this process (a test binary on its timeout, or Ctrl-C on make dist),
	// and with its compiler and linker when ctx ends.
	childproc.TieGroup(cmd)
	if err := childproc.Run(cmd); err != nil {
		return "", fmt.Errorf("go build for %s: %w\n%s", p, err, b.Bytes())
	}
	return out, nil
}

// buildBinaries builds every platform, two at a time (go build itself is parallel).
func buildBinaries(ctx context.Context, r Release, plats []Platform, dir string) (map[Platform]string, error) {
	bins := make(map[Platform]string, len(plats))
	paths := make([]string, len(plats))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for i, p := range plats {
		g.Go(func() error {
			var err error
			paths[i], err = BuildBinary(ctx, r, p, dir)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i, p := range plats {
		bins[p] = paths[i]
	}
	return bins, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "upgradeguard")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the upgradeguard repository (no cmd/upgradeguard above the working directory)")
		}
		dir = parent
	}
}
