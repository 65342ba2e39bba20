package admissionpolicy

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/kubernetes"
)

// selfAuthorizer answers a policy's authorizer checks (its `authorizer` variable) for the
// writer, who is the caller, with SelfSubjectAccessReviews, which every identity may
// make. A check about anyone else has no answer here (no opinion, with the reason).
type selfAuthorizer struct {
	kube kubernetes.Interface
	self user.Info
}

func (s *selfAuthorizer) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if u := a.GetUser(); u == nil || u.GetName() != s.self.GetName() {
		return authorizer.DecisionNoOpinion, "upgradeguard asks the API server only about its own identity", nil
	}
	review := &authorizationv1.SelfSubjectAccessReview{}
	if a.IsResourceRequest() {
		review.Spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Namespace: a.GetNamespace(), Verb: a.GetVerb(), Group: a.GetAPIGroup(), Version: a.GetAPIVersion(),
			Resource: a.GetResource(), Subresource: a.GetSubresource(), Name: a.GetName(),
		}
	} else {
		review.Spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: a.GetPath(), Verb: a.GetVerb()}
	}
	r, err := s.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return authorizer.DecisionNoOpinion, "", fmt.Errorf("ask the API server (a SelfSubjectAccessReview): %w", err)
	}
	switch {
	case r.Status.Allowed:
		return authorizer.DecisionAllow, r.Status.Reason, nil
	case r.Status.Denied:
		return authorizer.DecisionDeny, r.Status.Reason, nil
	}
	return authorizer.DecisionNoOpinion, r.Status.Reason, nil
}
