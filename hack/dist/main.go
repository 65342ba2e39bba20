// Command dist builds upgradeguard's release artefacts, reproducibly and without a
// container daemon:
//
//	go run ./hack/dist image     # OCI image index (linux/amd64, linux/arm64) -> dist/image/
//	go run ./hack/dist archives  # archives, checksums, SBOMs, krew manifest, Helm plugins -> dist/
//	go run ./hack/dist verify    # re-checks dist/: checksums and the krew manifest
//
// Everything is stamped with the commit time (SOURCE_DATE_EPOCH when set), so two builds
// of one commit give the same bytes and the same image digest. `make image` and
// `make dist` are the front doors; docs/development.md has the release checklist.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dist", flag.ContinueOnError)
	out := fs.String("out", "dist", "output directory")
	version := fs.String("version", "", "release version vX.Y.Z (default: the tag on HEAD, else a Go pseudo-version of HEAD)")
	platforms := fs.String("platforms", "", "comma-separated os/arch list (default: every release platform; image: linux/amd64,linux/arm64)")
	sbomTool := fs.String("cyclonedx-gomod", "bin/cyclonedx-gomod", "cyclonedx-gomod binary for the SBOMs (archives; empty: no SBOMs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: dist [flags] image|archives|verify")
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	outDir, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	if fs.Arg(0) == "verify" {
		plats, err := parsePlatforms(*platforms, ReleasePlatforms)
		if err != nil {
			return err
		}
		return verifyDist(outDir, plats)
	}
	rel, err := currentRelease(ctx, root, *version)
	if err != nil {
		return err
	}
	switch fs.Arg(0) {
	case "image":
		plats, err := parsePlatforms(*platforms, ImagePlatforms)
		if err != nil {
			return err
		}
		bins, err := buildBinaries(ctx, rel, plats, filepath.Join(outDir, "bin"))
		if err != nil {
			return err
		}
		res, err := BuildImage(rel, bins, filepath.Join(outDir, "image"))
		if err != nil {
			return err
		}
		fmt.Printf("image %s\n  digest %s\n  layout %s\n  archive %s\n", res.Ref, res.Digest, res.Layout, res.Archive)
		for _, t := range res.DockerArchives {
			fmt.Printf("  docker archive %s\n", t)
		}
		return nil
	case "archives":
		plats, err := parsePlatforms(*platforms, ReleasePlatforms)
		if err != nil {
			return err
		}
		bins, err := buildBinaries(ctx, rel, plats, filepath.Join(outDir, "bin"))
		if err != nil {
			return err
		}
		if err := cleanArtefacts(outDir); err != nil {
			return err
		}
		tool := *sbomTool // empty: no SBOMs
		if tool != "" && !filepath.IsAbs(tool) {
			tool = filepath.Join(root, tool)
		}
		res, err := Package(ctx, rel, bins, outDir, tool)
		if err != nil {
			return err
		}
		for _, a := range res.Artefacts {
			fmt.Println(filepath.Join(outDir, a))
		}
		return verifyDist(outDir, plats)
	default:
		return fmt.Errorf("unknown target %q: use image, archives or verify", fs.Arg(0))
	}
}

func parsePlatforms(s string, def []Platform) ([]Platform, error) {
	if s == "" {
		return def, nil
	}
	var out []Platform
	for _, p := range strings.Split(s, ",") {
		os, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || os == "" || arch == "" {
			return nil, fmt.Errorf("platform %q: want os/arch, e.g. linux/amd64", p)
		}
		out = append(out, Platform{OS: os, Arch: arch})
	}
	return out, nil
}

// cleanArtefacts removes a previous version's artefacts from the dist folder, so that
// what is there is what checksums.txt lists. The binaries (bin/) and the image are
// rewritten in place.
func cleanArtefacts(dir string) error {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "bin" || e.Name() == "image" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
