package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

type snapshotOptions struct {
	file     string
	push     string
	registry snapshot.Registry
	take     snapshot.Options
}

func newSnapshotCmd(streams Streams, kube *genericclioptions.ConfigFlags) *cobra.Command {
	o := &snapshotOptions{}
	cmd := command("snapshot (-o FILE | --push oci://REGISTRY/REPOSITORY:TAG)", "Record what review needs of a cluster, so a CI job without cluster credentials can judge against it",
		snapshotLong, snapshotExample, cobra.NoArgs,
		func(cmd *cobra.Command, _ []string) error { return o.run(cmd.Context(), streams, kube) })
	f := cmd.Flags()
	f.StringVarP(&o.file, "output", "o", "", "write the snapshot to FILE (- for standard output)")
	f.StringVar(&o.push, "push", "", "push the snapshot to an OCI registry as an artifact: oci://REGISTRY/REPOSITORY:TAG")
	addRegistryFlags(f, &o.registry)
	f.StringVar(&o.take.ArgoCDNamespace, "argocd-namespace", argoapp.DefaultNamespace, "the namespace of Argo CD, whose argocd-cm says how it tracks an Application's objects (only its tracking entries are recorded)")
	return cmd
}

// addRegistryFlags are the flags that say how to reach an OCI registry of snapshots.
func addRegistryFlags(f *pflag.FlagSet, r *snapshot.Registry) {
	f.BoolVar(&r.PlainHTTP, "plain-http", false, "speak plain HTTP to the OCI registry (one on loopback or in a test)")
	f.StringVar(&r.Config, "registry-config", "", "registry credentials file, as docker login and helm registry login write it (default: Docker's, DOCKER_CONFIG or ~/.docker/config.json)")
}

func (o *snapshotOptions) run(ctx context.Context, streams Streams, kube *genericclioptions.ConfigFlags) error {
	if o.file == "" && o.push == "" {
		return couldNot("say where the snapshot goes: -o FILE, or --push oci://REGISTRY/REPOSITORY:TAG")
	}
	if o.push != "" && !snapshot.IsOCI(o.push) {
		return couldNot("--push %q: want oci://REGISTRY/REPOSITORY:TAG", o.push)
	}
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return couldNot("load kubeconfig: %w (set --kubeconfig or KUBECONFIG, and --context)", err)
	}
	s, err := snapshot.Take(ctx, cfg, o.take)
	if err != nil {
		return couldNot("take the snapshot: %w (check --kubeconfig, and that the identity may list CRDs, their objects and Secrets)", err)
	}
	if o.file != "" {
		if err := writeSnapshot(streams, o.file, s); err != nil {
			return err
		}
	}
	if o.push != "" {
		digest, err := o.registry.Push(ctx, s, o.push)
		if err != nil {
			return couldNot("%w (check the reference, --registry-config or docker login, and --plain-http for a registry without TLS)", err)
		}
		fmt.Fprintf(streams.ErrOut, "pushed the snapshot to %s@%s\n", o.push, digest)
	}
	fmt.Fprintf(streams.ErrOut, "snapshot of Kubernetes %s: %d CRDs, %d Helm releases, taken %s in %s\n",
		s.Server.Version, len(s.CRDs), len(s.Releases), s.TakenAt.Format(time.RFC3339), time.Duration(s.Took))
	return nil
}

// writeSnapshot writes s to file, or to standard output for "-"; a file is written
// whole or not at all.
func writeSnapshot(streams Streams, file string, s *snapshot.Snapshot) error {
	if file == "-" {
		if err := s.Write(streams.Out); err != nil {
			return couldNot("write the snapshot: %w", err)
		}
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".snapshot-*")
	if err != nil {
		return couldNot("write the snapshot: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename
	if err := s.Write(tmp); err != nil {
		_ = tmp.Close()
		return couldNot("write the snapshot to %s: %w", file, err)
	}
	if err := tmp.Close(); err != nil {
		return couldNot("write the snapshot to %s: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return couldNot("write the snapshot to %s: %w", file, err)
	}
	return nil
}

// loadSnapshot reads a snapshot from a file or an OCI registry (oci://...).
func loadSnapshot(ctx context.Context, r snapshot.Registry, ref string) (*snapshot.Snapshot, error) {
	if snapshot.IsOCI(ref) {
		return r.Pull(ctx, ref)
	}
	f, err := os.Open(ref)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	s, err := snapshot.Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return s, nil
}

const snapshotLong = `snapshot records what review's verdicts need of a cluster, where credentials exist (a
scheduled pipeline, or the controller), so that a CI job that holds no cluster
credentials can review a pull request against it (review --snapshot NAME=FILE, or
NAME=oci://...):

  - per CRD: its versions (served, storage, schemas), storedVersions, conversion, how
    many objects it holds, and which field paths those objects hold, with a count each
    and no value (a path stops at a map, since its keys can be data);
  - the Helm releases (stored in Secrets): each revision's chart, version and status,
    and the CRDs the current revision carries with their keep annotations;
  - the Flux HelmReleases and Argo CD Applications that track releases, with what each
    Application's status says it deployed and the CRDs of its resource tree;
  - how Argo CD tracks an Application's objects (argocd-cm's tracking entries);
  - the API server's version, when it was taken and how long it took.

It holds no object name (but those of CRDs, releases, HelmReleases and Applications),
no field value, no Secret data, no release values and no repository credentials (a
review fetches charts with its own Helm settings). It only reads: it needs list on
customresourcedefinitions, on every CRD's objects and on Secrets, and get on argocd-cm
where allowed.

-o FILE writes it as JSON (schemaVersion 1); --push sends it to an OCI registry as an
artifact (type application/vnd.upgradeguard.snapshot.v1+json), with the credentials of
docker login or helm registry login (--registry-config). Both may be given.

What a snapshot cannot tell: whether the API server accepts an incoming CRD (a dry-run
write), and which objects would fail a new validation rule (their values are not in it).
A review from a snapshot reports pruned fields, storage versions and deletions as a live
one does.

Exit codes: 0 written; 2 could not run.`

const snapshotExample = `  # Record the current context to a file
  upgradeguard snapshot -o prod-eu.json

  # A scheduled pipeline pushes it where CI can read it
  upgradeguard snapshot --push oci://registry.example.com/fleet/snapshots:prod-eu`
