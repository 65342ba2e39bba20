package crdschema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/lru"
)

// Judges keeps compiled judges between checks, so a repeated decision on the same schema
// change (the admission gate asked again about the same chart) compiles nothing: the
// structural schemas and CEL validators of a large CRD take tens of milliseconds and
// megabytes to build. A judge is kept by the identity of the live CRD as the API server
// stored it (UID and resourceVersion: any change to it, status.storedVersions included,
// gives a new key) and a hash of the incoming CRD's content. The hash of an incoming CRD
// is itself kept by pointer, so the CRDs a render cache hands out again are not hashed
// again: an incoming CRD must not be modified once it has been judged. Both are bounded
// (least recently used go first). It is safe for concurrent use; a nil *Judges compiles
// every time.
type Judges struct {
	judges *lru.Cache // judgeKey -> *judgeEntry
	hashes *lru.Cache // *apiextv1.CustomResourceDefinition -> string
}

type judgeEntry struct {
	judge   *Judge
	changed bool
	err     error
}

// NewJudges keeps up to n compiled judges (default 32; a judge of a large CRD holds a few
// MiB of compiled validators).
func NewJudges(n int) *Judges {
	if n <= 0 {
		n = 32
	}
	return &Judges{judges: lru.New(n), hashes: lru.New(4 * n)}
}

// Get returns the judge of the change from live to next and whether the change can touch
// stored objects at all (Changed); the judge is nil when it cannot. A live CRD read from
// the API server must carry its UID and resourceVersion to be kept; one without them (a
// CRD built in memory) is compiled every time.
func (c *Judges) Get(live, next *apiextv1.CustomResourceDefinition) (*Judge, bool, error) {
	if c == nil || live == nil || next == nil || live.UID == "" || live.ResourceVersion == "" {
		return compileChange(live, next)
	}
	sum, err := c.hash(next)
	if err != nil {
		return compileChange(live, next)
	}
	key := string(live.UID) + "/" + live.ResourceVersion + "/" + sum
	if v, ok := c.judges.Get(key); ok {
		e := v.(*judgeEntry)
		return e.judge, e.changed, e.err
	}
	j, changed, err := compileChange(live, next)
	c.judges.Add(key, &judgeEntry{judge: j, changed: changed, err: err})
	return j, changed, err
}

// Len is how many judges are kept.
func (c *Judges) Len() int { return c.judges.Len() }

func (c *Judges) hash(next *apiextv1.CustomResourceDefinition) (string, error) {
	if v, ok := c.hashes.Get(next); ok {
		return v.(string), nil
	}
	data, err := json.Marshal(next)
	if err != nil {
		return "", fmt.Errorf("hash CRD %s: %w", next.Name, err)
	}
	sum := sha256.Sum256(data)
	s := hex.EncodeToString(sum[:])
	c.hashes.Add(next, s)
	return s, nil
}

func compileChange(live, next *apiextv1.CustomResourceDefinition) (*Judge, bool, error) {
	if !Changed(live, next) {
		return nil, false, nil
	}
	j, err := New(live, next)
	return j, true, err
}
