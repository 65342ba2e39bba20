package testenv

import (
	"bufio"
	"encoding/json"
	"os"
)

// AuditEvent is the part of an API server audit event that tests look at.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	Stage      string `json:"stage"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
}

// AuditEvents returns the completed requests the given user made, from the audit log.
func (cp *ControlPlane) AuditEvents(user string) ([]AuditEvent, error) {
	f, err := os.Open(cp.AuditLog)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, err
		}
		if ev.User.Username == user && ev.Stage == "ResponseComplete" {
			out = append(out, ev)
		}
	}
	return out, sc.Err()
}
