package check

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// ObjectLister is what a Cluster implements when it can read objects whole, for the
// schema check (livecluster.KubeCluster does). A Cluster without it gets no schema
// findings.
type ObjectLister interface {
	ListObjects(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
}

// SkeletonLister is what a Cluster implements when the objects it lists are
// crdschema.Skeletons of recorded field paths (a snapshot's), not the stored objects: the
// schema check then judges pruning only.
type SkeletonLister interface {
	SkeletonObjects() bool
}

// skeletons says whether the cluster's objects are skeletons.
func skeletons(cluster Cluster) bool {
	s, ok := cluster.(SkeletonLister)
	return ok && s.SkeletonObjects()
}

// judgement is one CRD the operation writes over a live one (nil live: a create; nil
// next: the deletion of live, which only the admission policies judge).
type judgement struct {
	live, next *apiextv1.CustomResourceDefinition
}

// name is the CRD's name.
func (j judgement) name() string {
	if j.next == nil {
		return j.live.Name
	}
	return j.next.Name
}

type listerFunc func(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)

func (f listerFunc) List(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	return f(ctx, gvr, opts)
}

// judgeSchemas judges the stored objects of every written CRD against its incoming schema
// and joins the finding to the verdict (predict.WithSchema). CRDs whose schemas do not
// change for stored or served versions are not read. Objects that cannot be listed leave
// the verdict as it is and say why; a forbidden list stops the run (the caller lacks RBAC).
func judgeSchemas(ctx context.Context, cluster Cluster, judged []judgement, crds []CRDReport) error {
	ol, ok := cluster.(ObjectLister)
	if !ok || len(judged) == 0 {
		return nil
	}
	byName := map[string]int{}
	for i := range crds {
		byName[crds[i].Name] = i
	}
	judges := judgesOf(cluster)
	minor := serverMinor(ctx, cluster)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, j := range judged {
		c := &crds[byName[j.next.Name]]
		g.Go(func() error {
			judge, changed, err := judges.Get(j.live, j.next)
			if !changed {
				return nil // no schema that stored objects meet changes: nothing to compile or read
			}
			if err != nil {
				c.SchemaError = err.Error()
				return nil
			}
			if len(judge.Reads()) == 0 && judge.ConversionRemoved() == nil {
				return nil
			}
			rep, err := judge.Scan(gctx, listerFunc(ol.ListObjects), crdschema.ScanOptions{ServerMinor: minor, Skeletons: skeletons(cluster)})
			if err != nil {
				if isForbidden(err) {
					return fmt.Errorf("read objects of %s to judge the new schema: %w", j.live.Name, err)
				}
				c.SchemaError = err.Error()
				return nil
			}
			c.Schema = rep
			c.Decision = predict.WithSchema(c.Decision, j.live, predict.Schema{
				Pruned: rep.PrunedPaths(), ConversionRemoved: rep.ConversionRemoved != nil, Summary: rep.Summary()})
			return nil
		})
	}
	return g.Wait()
}

// judgesOf is the cache of compiled judges the cluster's Memory keeps between runs, or
// nil: every judge is then compiled for this run.
func judgesOf(cluster Cluster) *crdschema.Judges {
	if m := cluster.Memory(); m != nil {
		return m.judges
	}
	return nil
}

// Server is what a Cluster implements when the API server itself can be asked
// (livecluster.KubeCluster does): its version, in whose words the schema findings are
// given, and whether it accepts an incoming CRD (crdschema.Admit). The rules of CRD
// validation and their wording differ between Kubernetes minors: only the target server
// knows its own.
type Server interface {
	ServerVersion(ctx context.Context) (string, error)
	AdmitCRD(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) (*crdschema.Refusal, error)
}

// serverMinor is the target server's Kubernetes minor, 0 when it cannot tell.
func serverMinor(ctx context.Context, cluster Cluster) int {
	s, ok := cluster.(Server)
	if !ok {
		return 0
	}
	v, err := s.ServerVersion(ctx)
	if err != nil {
		return 0
	}
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return 0
	}
	return int(parsed.Minor())
}

// PolicyEvaluator is what a Cluster implements when it can evaluate the cluster's
// admission policies for a CRD write here, with the API server's own policy code, from
// what the caller may read (livecluster.KubeCluster does): no write, so a read-only
// identity gets the verdict an admin gets. A nil live is a create, a nil next the
// deletion of live (admissionpolicy.Policies.Evaluate).
type PolicyEvaluator interface {
	PolicyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error)
}

// answer is what one question about an incoming CRD's admission got: the answer, or why
// it could not be asked.
type answer[T any] struct {
	name string
	v    T
	err  error
}

// policyAnswer is what the policies decide about one incoming CRD: their denials.
type policyAnswer = answer[[]admissionpolicy.Denial]

// admission is the API server's answer about one incoming CRD: a refusal (nil: accepted).
// When its dry run could not be asked (err), the CRD's own validation was evaluated here
// instead (crdschema.Validate): local says by which minor's rules, and v is its refusal;
// localErr says why it could not be.
type admission struct {
	answer[*crdschema.Refusal]
	local    *crdschema.Local
	localErr error
}

// evaluatePolicies evaluates the admission policies for every applied incoming CRD (the
// same writes admit asks the API server about) and every deletion, bounded, in the order
// given. Policies
// that cannot be read are an answer too: the run goes on, and the report says what was
// not asked.
func evaluatePolicies(ctx context.Context, cluster Cluster, admitted []judgement) ([]policyAnswer, error) {
	pe, ok := cluster.(PolicyEvaluator)
	if !ok {
		return nil, nil
	}
	return askEach(ctx, admitted, pe.PolicyDenials)
}

// admit asks the API server whether it accepts every applied incoming CRD, bounded, and
// returns its answers in the order asked (joinAdmission makes them verdicts). A server
// that cannot be asked (no RBAC for the dry run) is an answer too: the run goes on, with
// the CRD's own validation evaluated here, by the rules of the minor this build links
// (crdschema.Validate; the server's minor says whether they are its own).
func admit(ctx context.Context, cluster Cluster, admitted []judgement) ([]admission, error) {
	s, ok := cluster.(Server)
	if !ok {
		return nil, nil
	}
	answers, err := askEach(ctx, admitted, s.AdmitCRD)
	if err != nil {
		return nil, err
	}
	out := make([]admission, len(answers))
	minor := -1
	for i, a := range answers {
		out[i].answer = a
		if a.err == nil {
			continue
		}
		if minor < 0 {
			minor = serverMinor(ctx, cluster)
		}
		local := crdschema.LocalRules(minor)
		out[i].local = &local
		out[i].v, out[i].localErr = crdschema.Validate(ctx, admitted[i].live, admitted[i].next, minor)
	}
	return out, nil
}

// askEach asks one question about every judgement, four at a time, and returns the
// answers in the order given; an error is an answer, but for the context's own.
func askEach[T any](ctx context.Context, js []judgement, ask func(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) (T, error)) ([]answer[T], error) {
	if len(js) == 0 {
		return nil, nil
	}
	out := make([]answer[T], len(js))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i, j := range js {
		g.Go(func() error {
			v, err := ask(gctx, j.live, j.next)
			if err != nil && gctx.Err() != nil {
				return gctx.Err()
			}
			out[i] = answer[T]{name: j.name(), v: v, err: err}
			return nil
		})
	}
	return out, g.Wait()
}

// joinAdmission joins what admission decides to the verdicts: a CRD a policy denies is
// the PolicyDenied verdict, and a CRD the API server refuses (its dry run) the Refused
// one. A dry run refused by admission, for a CRD the policies deny, is the same denial
// seen both ways (the API server's policies run before its webhooks, and its first
// denial is its answer): reported once, as the policy's. So is a dry run that
// upgradeguard's own gate denied, for a CRD whose verdict already blocks: the gate's
// answer is that verdict (crdschema.Refusal.Gate). A CRD's own validation runs
// before admission, so its refusal stands beside a policy's denial. What could not be
// asked is returned (Report.Unasked): the dry run, for a CRD no policy denies (webhooks
// answer only to it), with the policies when they could not be read either; the policies
// for a deletion, which no dry run asks about. A deletion's denials are left in Policies
// for the removal's verdict, decided once its objects are counted
// (predict.WithDeletionDenied, in Run). The CRD's own validation, evaluated here in the
// dry run's stead, gives its refusal as the API server's would; it is not asked
// (UnaskedValidation) when it ran by another minor's rules than the server's, or could
// not run.
func joinAdmission(answers []admission, policies []policyAnswer, deleted []judgement, crds []CRDReport) []Unasked {
	byName := map[string]int{}
	for i := range crds {
		byName[crds[i].Name] = i
	}
	var unasked []Unasked
	add := func(u Unasked, name string) {
		for i := range unasked {
			if unasked[i].What == u.What { // the first CRD's why stands for the rest
				unasked[i].CRDs = append(unasked[i].CRDs, name)
				return
			}
		}
		u.CRDs = []string{name}
		unasked = append(unasked, u)
	}
	deletion := map[string]bool{}
	for _, j := range deleted {
		deletion[j.name()] = true
	}
	policyErr := map[string]error{}
	for _, p := range policies {
		c := &crds[byName[p.name]]
		switch {
		case p.err != nil:
			c.PolicyError, policyErr[p.name] = p.err.Error(), p.err
			if deletion[p.name] {
				add(Unasked{What: UnaskedPolicies, Why: p.err.Error()}, p.name) // no dry run asks about a deletion
			}
		case len(p.v) > 0:
			c.Policies = p.v
			if !deletion[p.name] { // a deletion's verdict is joined with the removal's (Run)
				c.Decision = predict.WithPolicy(c.Decision, admissionpolicy.Message(p.v))
			}
		}
	}
	for _, a := range answers {
		c := &crds[byName[a.name]]
		switch {
		case a.err != nil:
			c.AdmissionError = a.err.Error()
			if a.v != nil { // the CRD's own validation, evaluated here, refuses it
				c.Refusal = a.v
				c.Decision = predict.WithRefusal(c.Decision, a.v.Message())
			}
			if len(c.Policies) > 0 {
				continue // a policy denies it: what else admission says cannot let it through
			}
			add(Unasked{What: UnaskedDryRun, Why: a.err.Error(), Local: a.local}, a.name)
			if err := policyErr[a.name]; err != nil {
				add(Unasked{What: UnaskedPolicies, Why: err.Error()}, a.name)
			}
			// The CRD's own validation evaluated here is not the server's answer when it
			// ran by another minor's rules, or could not run.
			switch {
			case a.localErr != nil:
				add(Unasked{What: UnaskedValidation, Why: a.localErr.Error()}, a.name)
			case a.local != nil && !a.local.Stands():
				add(Unasked{What: UnaskedValidation, Why: a.local.String(), Local: a.local}, a.name)
			}
		case a.v != nil && a.v.Gate && c.Verdict.Blocks():
			// upgradeguard's own gate denied the dry run for the finding reported here
			// (it decides with this same engine): one finding, not a second refusal.
		case a.v != nil && a.v.Admission && len(c.Policies) > 0:
			// The policy's denial, seen by the dry run too.
		case a.v != nil:
			c.Refusal = a.v
			c.Decision = predict.WithRefusal(c.Decision, a.v.Message())
		}
	}
	return unasked
}
