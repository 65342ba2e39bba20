package crdschema_test

import (
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

func judgeCRD(uid, rv string, fields ...string) *apiextv1.CustomResourceDefinition {
	props := map[string]apiextv1.JSONSchemaProps{}
	for _, f := range fields {
		props[f] = apiextv1.JSONSchemaProps{Type: "string"}
	}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "things.judges.example.io", UID: k8stypes.UID(uid), ResourceVersion: rv},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "judges.example.io", Scope: apiextv1.NamespaceScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "things", Kind: "Thing"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{"spec": {Type: "object", Properties: props}}}}}},
		},
	}
}

// TestJudgesKeys: a kept judge is reused only for the same live CRD (UID and
// resourceVersion) and the same incoming content; any change to either compiles anew,
// and so does a live CRD that carries no identity. A nil *Judges compiles every time.
func TestJudgesKeys(t *testing.T) {
	js := crdschema.NewJudges(8)
	live := judgeCRD("1", "10", "a", "b")
	next := judgeCRD("", "", "b")
	first, changed, err := js.Get(live, next)
	if err != nil || !changed || first == nil {
		t.Fatalf("first Get: judge %v changed %v err %v", first, changed, err)
	}
	check := func(name string, live, next *apiextv1.CustomResourceDefinition, wantSame bool) {
		t.Helper()
		j, changed, err := js.Get(live, next)
		if err != nil || !changed || j == nil {
			t.Fatalf("%s: judge %v changed %v err %v", name, j, changed, err)
		}
		if same := j == first; same != wantSame {
			t.Errorf("%s: same judge = %v, want %v", name, same, wantSame)
		}
	}
	check("same live, same incoming", live, next, true)
	check("same live, incoming with the same content (a fresh render)", live.DeepCopy(), judgeCRD("", "", "b"), true)
	check("live at a new resourceVersion", judgeCRD("1", "11", "a", "b"), next, false)
	check("live re-created (new UID)", judgeCRD("2", "10", "a", "b"), next, false)
	check("incoming with other content", live, judgeCRD("", "", "b", "c"), false)
	check("live without an identity", judgeCRD("", "", "a", "b"), next, false)

	if j, changed, err := js.Get(live, judgeCRD("", "", "a", "b")); err != nil || changed || j != nil {
		t.Errorf("unchanged schema: judge %v changed %v err %v, want nil false nil", j, changed, err)
	}
	var none *crdschema.Judges
	a, _, _ := none.Get(live, next)
	b, _, _ := none.Get(live, next)
	if a == nil || a == b {
		t.Errorf("nil Judges: judges %p and %p, want two compiled", a, b)
	}
}
