// Package apf owns upgradeguard's API Priority and Fairness objects: a
// PriorityLevelConfiguration that bounds how many of a migration's writes the API server
// runs at once, and a FlowSchema that sends the migration's PATCH requests there. The API
// server, not the client, then decides who waits: other clients keep their own priority
// levels' seats while a migration queues in its own.
//
// The FlowSchema matches only PATCH, the verb of a migration's writes (an empty merge
// patch per object); the same identity's reads, watches, creates, updates and deletes
// (Leases, StorageMigration statuses, the gate's informers) keep the level they had. The
// chart ships these objects (templates/apf.yaml, compared with Objects in its test) and
// `upgradeguard apf` prints or applies them for a CLI user.
//
// Observe tells, from the API server's own response headers, which FlowSchema and
// priority level a client's writes ran under.
package apf

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Name names both objects unless Options.Name names them (the chart names them after
// its release: RELEASE-upgradeguard-migrations, or upgradeguard-migrations for a
// release named upgradeguard).
const Name = "upgradeguard-migrations"

// Defaults of Options. MatchingPrecedence 850 comes before the suggested FlowSchemas that
// would otherwise take the migration's writes (kube-system-service-accounts at 900,
// service-accounts at 9000, global-default at 9900) and after the system's own (exempt,
// leader election, nodes, kube-controller-manager and kube-scheduler at 800).
// NominalConcurrencyShares 2 gives the level about 5 of a default API server's 600 seats
// (shares are weighed against the suggested levels', about 245 in all), with nothing
// lent or borrowed, so a migration never holds more; its other requests queue.
const (
	DefaultMatchingPrecedence       = 850
	DefaultNominalConcurrencyShares = 2
	DefaultQueues                   = 16
	DefaultHandSize                 = 4
	DefaultQueueLengthLimit         = 50
)

// Options shape the objects. Zero values take the defaults above.
type Options struct {
	// Name of both objects (default Name).
	Name string
	// Subjects are the identities whose migration writes the FlowSchema matches: the
	// controller's ServiceAccount, or a CLI user or group.
	Subjects []flowcontrolv1.Subject
	// Labels go on both objects.
	Labels map[string]string

	MatchingPrecedence       int32
	NominalConcurrencyShares int32
	Queues                   int32
	HandSize                 int32
	QueueLengthLimit         int32
}

func orDefault(v, d int32) int32 {
	if v == 0 {
		return d
	}
	return v
}

// ServiceAccount is the subject of a ServiceAccount's requests.
func ServiceAccount(namespace, name string) flowcontrolv1.Subject {
	return flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
		ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: name}}
}

// User is the subject of a user's requests.
func User(name string) flowcontrolv1.Subject {
	return flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: name}}
}

// Group is the subject of the requests of a group's members.
func Group(name string) flowcontrolv1.Subject {
	return flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: name}}
}

// Objects are the PriorityLevelConfiguration and the FlowSchema, in the order to apply them.
func Objects(o Options) (*flowcontrolv1.PriorityLevelConfiguration, *flowcontrolv1.FlowSchema) {
	name := o.Name
	if name == "" {
		name = Name
	}
	meta := func(kind string) (metav1.TypeMeta, metav1.ObjectMeta) {
		return metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(), Kind: kind},
			metav1.ObjectMeta{Name: name, Labels: o.Labels}
	}
	zero := int32(0)
	shares := orDefault(o.NominalConcurrencyShares, DefaultNominalConcurrencyShares)
	pl := &flowcontrolv1.PriorityLevelConfiguration{Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
		Type: flowcontrolv1.PriorityLevelEnablementLimited,
		Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
			NominalConcurrencyShares: &shares,
			LendablePercent:          &zero,
			BorrowingLimitPercent:    &zero,
			LimitResponse: flowcontrolv1.LimitResponse{
				Type: flowcontrolv1.LimitResponseTypeQueue,
				Queuing: &flowcontrolv1.QueuingConfiguration{
					Queues:           orDefault(o.Queues, DefaultQueues),
					HandSize:         orDefault(o.HandSize, DefaultHandSize),
					QueueLengthLimit: orDefault(o.QueueLengthLimit, DefaultQueueLengthLimit),
				},
			},
		},
	}}
	pl.TypeMeta, pl.ObjectMeta = meta("PriorityLevelConfiguration")
	fs := &flowcontrolv1.FlowSchema{Spec: flowcontrolv1.FlowSchemaSpec{
		PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: name},
		MatchingPrecedence:         orDefault(o.MatchingPrecedence, DefaultMatchingPrecedence),
		DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
		Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
			Subjects: o.Subjects,
			ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
				Verbs:        []string{"patch"},
				APIGroups:    []string{flowcontrolv1.APIGroupAll},
				Resources:    []string{flowcontrolv1.ResourceAll},
				ClusterScope: true,
				Namespaces:   []string{flowcontrolv1.NamespaceEvery},
			}},
		}},
	}}
	fs.TypeMeta, fs.ObjectMeta = meta("FlowSchema")
	return pl, fs
}

// The response headers in which the API server names the FlowSchema and the priority
// level a request was classified into (by UID).
const (
	HeaderFlowSchemaUID    = "X-Kubernetes-PF-FlowSchema-UID"
	HeaderPriorityLevelUID = "X-Kubernetes-PF-PriorityLevel-UID"
)

// Observer records the FlowSchema and priority level of the first PATCH response that
// names them, over every client built from the config Observe returned.
type Observer struct {
	mu                        sync.Mutex
	flowSchema, priorityLevel types.UID
}

// Observe is cfg with each transport built from it wrapped to report to one Observer.
func Observe(cfg *rest.Config) (*rest.Config, *Observer) {
	o := &Observer{}
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return observed{o: o, next: rt} })
	return c, o
}

// observed is one transport reporting to an Observer.
type observed struct {
	o    *Observer
	next http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t observed) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodPatch {
		if fs := resp.Header.Get(HeaderFlowSchemaUID); fs != "" {
			t.o.mu.Lock()
			if t.o.flowSchema == "" {
				t.o.flowSchema, t.o.priorityLevel = types.UID(fs), types.UID(resp.Header.Get(HeaderPriorityLevelUID))
			}
			t.o.mu.Unlock()
		}
	}
	return resp, err
}

// Placement is where a client's writes ran in the API server's Priority and Fairness.
type Placement struct {
	// FlowSchema and PriorityLevel are the objects' names ("" when the client may not
	// read them; their UIDs are then kept).
	FlowSchema    string    `json:"flowSchema,omitempty"`
	PriorityLevel string    `json:"priorityLevel,omitempty"`
	FlowSchemaUID types.UID `json:"flowSchemaUID"`
	// Ours: the writes ran under the FlowSchema Placement was asked about
	// (upgradeguard's).
	Ours bool `json:"upgradeguardFlowSchema"`
}

// Placement resolves what o recorded into names, with kube, and says whether the writes
// ran under FlowSchema ours. It is nil when no PATCH response named a FlowSchema (no
// write was sent, or the API server runs without Priority and Fairness, or the request was
// exempt: system:masters).
func (o *Observer) Placement(ctx context.Context, kube kubernetes.Interface, ours string) *Placement {
	o.mu.Lock()
	fsUID, plUID := o.flowSchema, o.priorityLevel
	o.mu.Unlock()
	if fsUID == "" {
		return nil
	}
	p := &Placement{FlowSchemaUID: fsUID}
	api := kube.FlowcontrolV1()
	if schemas, err := api.FlowSchemas().List(ctx, metav1.ListOptions{}); err == nil {
		for _, s := range schemas.Items {
			if s.UID == fsUID {
				p.FlowSchema = s.Name
			}
		}
	} else if fs, err := api.FlowSchemas().Get(ctx, ours, metav1.GetOptions{}); err == nil && fs.UID == fsUID {
		p.FlowSchema = fs.Name // may get ours, not list every FlowSchema
	}
	if levels, err := api.PriorityLevelConfigurations().List(ctx, metav1.ListOptions{}); err == nil {
		for _, l := range levels.Items {
			if l.UID == plUID {
				p.PriorityLevel = l.Name
			}
		}
	}
	p.Ours = p.FlowSchema == ours
	return p
}

// FieldManager is the field manager of Apply.
const FieldManager = "upgradeguard"

// Apply creates or updates the objects with server-side apply, in order (the level before
// the FlowSchema that names it), taking over fields another manager set, and waits until
// the API server classifies requests by them.
func Apply(ctx context.Context, kube kubernetes.Interface, pl *flowcontrolv1.PriorityLevelConfiguration, fs *flowcontrolv1.FlowSchema) error {
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)}
	data, err := json.Marshal(pl)
	if err != nil {
		return err
	}
	if _, err := kube.FlowcontrolV1().PriorityLevelConfigurations().Patch(ctx, pl.Name, types.ApplyPatchType, data, opts); err != nil {
		return fmt.Errorf("apply PriorityLevelConfiguration %s: %w", pl.Name, err)
	}
	if data, err = json.Marshal(fs); err != nil {
		return err
	}
	if _, err := kube.FlowcontrolV1().FlowSchemas().Patch(ctx, fs.Name, types.ApplyPatchType, data, opts); err != nil {
		return fmt.Errorf("apply FlowSchema %s: %w", fs.Name, err)
	}
	return waitTakenIn(ctx, kube, fs.Name)
}

// waitTakenIn waits, up to 30 seconds, until the API server's Priority and Fairness
// configuration controller has taken FlowSchema name in: it then writes the schema's
// Dangling condition, False when the priority level it names exists. Requests sent before
// may still be classified by the configuration it had.
func waitTakenIn(ctx context.Context, kube kubernetes.Interface, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		fs, err := kube.FlowcontrolV1().FlowSchemas().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range fs.Status.Conditions {
			if c.Type == flowcontrolv1.FlowSchemaConditionDangling {
				last = c.Message
				return c.Status == flowcontrolv1.ConditionFalse, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("FlowSchema %s was applied, but the API server has not taken it in (Dangling condition %q): %w", name, last, err)
	}
	return nil
}

// Identity is who the API server takes a client for, as Priority and Fairness sees it.
type Identity struct {
	// Subject matches the client's requests in a FlowSchema: its ServiceAccount, or its
	// user name.
	Subject flowcontrolv1.Subject
	// Exempt: the client is in system:masters, whose requests the mandatory "exempt"
	// FlowSchema takes before any other; no FlowSchema of ours can hold them.
	Exempt bool
}

// Me asks the API server who the client is (a SelfSubjectReview, which any authenticated
// client may create).
func Me(ctx context.Context, kube kubernetes.Interface) (Identity, error) {
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("ask the API server who you are (SelfSubjectReview): %w", err)
	}
	u := r.Status.UserInfo
	id := Identity{Subject: User(u.Username), Exempt: slices.Contains(u.Groups, "system:masters")}
	if ns, name, err := serviceaccount.SplitUsername(u.Username); err == nil {
		id.Subject = ServiceAccount(ns, name)
	}
	return id, nil
}
