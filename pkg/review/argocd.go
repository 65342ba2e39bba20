package review

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"

	"helm.sh/helm/v4/pkg/cli"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

var applicationKind = schema.GroupKind{Group: argoapp.GVR.Group, Kind: "Application"}

// applicationChanges finds the Argo CD Applications with a Helm source (spec.source, or
// the one chart source of spec.sources) whose source the change touches: its repository,
// chart, path or targetRevision ("chart"), its Helm options, or a values file a
// multi-source Application reads through a $ref from this repository ("values"). An
// Application that is not a Helm source is not review's to judge.
func applicationChanges(base, head *Tree) ([]Change, error) {
	var out []Change
	for _, obj := range head.Objects {
		if obj.GroupVersionKind().GroupKind() != applicationKind {
			continue
		}
		app, err := application(obj)
		if err != nil {
			return nil, err
		}
		src, err := app.HelmSource()
		if err != nil {
			continue
		}
		field := []string{"spec", "source"}
		for i := range app.Spec.Sources {
			if &app.Spec.Sources[i] == src {
				field = []string{"spec", "sources", strconv.Itoa(i)}
			}
		}
		c := Change{Subject: app.Subject(), File: obj.File, Line: obj.Line(append(field, "targetRevision")...), To: src.TargetRevision,
			Acknowledge: strings.FieldsFunc(app.Annotations[AcknowledgeAnnotation], func(r rune) bool { return r == ',' || unicode.IsSpace(r) })}
		c.judge = judgeApplication(app, head)
		before, ok := base.Find(keyOf(obj.Unstructured), obj.File)
		if !ok {
			c.What = "new"
			out = append(out, c)
			continue
		}
		old, err := application(before)
		if err != nil {
			return nil, err
		}
		oldSrc, err := old.HelmSource()
		if err == nil {
			c.From = oldSrc.TargetRevision
		}
		switch {
		case err != nil || oldSrc.RepoURL != src.RepoURL || oldSrc.Chart != src.Chart || oldSrc.Path != src.Path || oldSrc.TargetRevision != src.TargetRevision:
			c.What = "chart"
		case !apiequality.Semantic.DeepEqual(old.Spec.Source, app.Spec.Source) || !apiequality.Semantic.DeepEqual(old.Spec.Sources, app.Spec.Sources):
			c.What, c.Line = "values", obj.Line(append(field, "helm")...)
		default:
			f, ok := changedRefFile(app, src, base, head)
			if !ok {
				continue
			}
			before, _ := fileBytes(base, f)
			after, _ := fileBytes(head, f)
			c.What, c.File, c.Line, c.place = "values", f, firstChangedLine(before, after), obj.File
		}
		out = append(out, c)
	}
	return out, nil
}

// application decodes an Application; one without a namespace is in Argo CD's.
func application(o Object) (*argoapp.Application, error) {
	app, err := argoapp.FromUnstructured(o.Unstructured)
	if err != nil {
		return nil, err
	}
	if app.Namespace == "" {
		app.Namespace = argoapp.DefaultNamespace
	}
	return app, nil
}

// changedRefFile is the first values file of the Helm source, read through a $ref from
// this repository, that the change touches.
func changedRefFile(app *argoapp.Application, src *argoapp.Source, base, head *Tree) (string, bool) {
	if src.Helm == nil || len(app.Spec.Sources) == 0 {
		return "", false
	}
	for _, f := range src.Helm.ValueFiles {
		if !strings.HasPrefix(f, "$") {
			continue
		}
		_, p, _ := strings.Cut(f, "/")
		a, aok := fileBytes(base, p)
		b, bok := fileBytes(head, p)
		if aok != bok || string(a) != string(b) {
			return p, true
		}
	}
	return "", false
}

// judgeApplication predicts Argo CD syncing the Application as the head revision holds
// it, as check --argocd-app does (argoapp.Resolve, Chart.Predict): the spec from the
// repository, the status (what Argo CD deployed and manages now) and Argo CD's tracking
// settings from the cluster (applicationOn), none when the Application is not there yet.
// A multi-source Application's $ref values files are read from the head revision. A
// source upgradeguard does not read is not judged, with why.
func judgeApplication(app *argoapp.Application, head *Tree) func(context.Context, Cluster, *cli.EnvSettings) (*check.Report, string, error) {
	return func(ctx context.Context, cl Cluster, settings *cli.EnvSettings) (*check.Report, string, error) {
		on, why, err := applicationOn(ctx, cl, app)
		if on == nil {
			return nil, why, err
		}
		a, o := *app, on.options
		a.Status, o.Helm = on.status, settings
		// A path in this repository is read from the head revision, not cloned.
		o.GitCharts = head.git.argoCharts(head, settings)
		if refs := refNames(app); len(refs) > 0 {
			dir, err := os.MkdirTemp("", "upgradeguard-review-ref-")
			if err != nil {
				return nil, "", err
			}
			defer func() { _ = os.RemoveAll(dir) }()
			if err := head.writeTo(dir, nil); err != nil {
				return nil, "", err
			}
			o.Refs = map[string]string{}
			for _, r := range refs {
				o.Refs[r] = dir
			}
		}
		ch, err := argoapp.Resolve(ctx, &a, o)
		if errors.As(err, new(*argoapp.UnsupportedError)) {
			return nil, err.Error(), nil
		}
		if err != nil {
			return nil, "", err
		}
		defer func() { _ = ch.Close() }()
		if ch.Options.KubeVersion == "" {
			ch.Options.KubeVersion = on.version
		}
		p, err := ch.Predict(ctx, on.cluster)
		if err != nil {
			return nil, "", err
		}
		p.Report.Application, p.Report.Namespace = app.Namespace+"/"+app.Name, ch.Options.Namespace
		return p.Report, "", nil
	}
}

// applicationState is what judging an Application reads of the cluster it lands on.
type applicationState struct {
	// cluster is the cluster check reads, and version its server's.
	cluster check.Cluster
	version string
	// status is the live Application's (empty when it is not there yet).
	status argoapp.Status
	// options read Argo CD's settings and repository credentials.
	options argoapp.Options
}

// applicationOn reads what judging app reads of the cluster: on a live cluster, the
// Application's status, and Argo CD's settings (argocd-cm) and repository Secrets; from a
// snapshot, the status and settings it recorded (argoapp.Status.Recorded), and no
// credentials, which a snapshot never holds (the chart is fetched with Helm's settings).
// A snapshot taken before snapshots recorded Argo CD gives no state, and why.
func applicationOn(ctx context.Context, cl Cluster, app *argoapp.Application) (*applicationState, string, error) {
	if s := cl.Snapshot; s != nil {
		if s.ArgoCD == nil {
			return nil, fmt.Sprintf("the snapshot of %s was taken before snapshots recorded Argo CD (what each Application deployed and manages, and Argo CD's settings): "+
				"take a new one (%s)", cl.Name, cmdline.Snapshot{}), nil
		}
		st := &applicationState{cluster: cl.recorded(), version: s.Server.Version,
			options: argoapp.Options{Namespace: s.ArgoCD.Namespace, Settings: s.ArgoCD.Settings, Recorded: true}}
		if rec := s.Application(app.Namespace, app.Name); rec != nil {
			st.status = rec.Status
		}
		return st, "", nil
	}
	t, err := cl.connect(ctx)
	if err != nil {
		return nil, "", err
	}
	dyn, err := dynamic.NewForConfig(cl.Config)
	if err != nil {
		return nil, "", err
	}
	st := &applicationState{cluster: t.Cluster, version: t.Version, options: argoapp.Options{Secrets: t.Clientset.CoreV1(), ConfigMaps: t.Clientset.CoreV1()}}
	live, err := argoapp.Get(ctx, dyn, app.Namespace, app.Name)
	var nf *argoapp.NotFoundError
	switch {
	case errors.As(err, &nf): // not created yet: nothing deployed
	case err != nil:
		return nil, "", err
	default:
		st.status = live.Status
	}
	return st, "", nil
}

// refNames are the refs of the Application's sources (spec.sources[].ref): each is read
// from the repository under review.
func refNames(app *argoapp.Application) []string {
	var out []string
	for _, s := range app.Spec.Sources {
		if s.Ref != "" {
			out = append(out, s.Ref)
		}
	}
	return out
}
