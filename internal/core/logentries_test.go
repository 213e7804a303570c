package core

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/internal/updatelog"
)

// logEntries returns the entries of c's verifiable log whose "update" is
// msg, decoded.
func logEntries(t *testing.T, c *Core, msg string) []map[string]any {
	t.Helper()
	p, err := c.UpdateLogPage(context.Background(), 0, MaxLogPage)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range p.Records {
		var e map[string]any
		if err := json.Unmarshal([]byte(r.Entry), &e); err != nil {
			t.Fatalf("entry %d: %v", r.Seq, err)
		}
		if e["update"] == msg {
			out = append(out, e)
		}
	}
	return out
}

func stringsOf(t *testing.T, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("%v is not a list", v)
	}
	out := []string{}
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			t.Fatalf("%v is not a list of strings", v)
		}
		out = append(out, s)
	}
	return out
}

// "quarry: manifest changed" names who acknowledged a full update, the
// initiator first (docs/update-log.md); it is empty when the initiator
// alone applied it.
func TestManifestChangedNamesAcknowledgers(t *testing.T) {
	ctx := context.Background()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second")}

	t.Run("initiated by one, acknowledged by the other", func(t *testing.T) {
		e := &faultEnv{w: w, dir: t.TempDir()}
		e.open(t)
		e.set(t, manifestOpts{threshold: 2})
		// second initiates, admin acknowledges: the order is the
		// initiator's first, not the manifest's.
		next := w.manifest(manifestOpts{threshold: 2, extraSecret: true})
		if res, err := e.c.Update(ctx, w.second.peer(), next); err != nil || res.MissingAcknowledgments != 1 {
			t.Fatalf("initiating: %+v, %v", res, err)
		}
		if res, err := e.c.AcknowledgeUpdate(ctx, w.admin.peer(), next); err != nil || res.MissingAcknowledgments != 0 {
			t.Fatalf("acknowledging: %+v, %v", res, err)
		}
		got := logEntries(t, e.c, updatelog.MsgManifestChanged)
		if len(got) != 1 {
			t.Fatalf("%d manifest changed entries", len(got))
		}
		if users := stringsOf(t, got[0]["users"]); !slices.Equal(users, []string{"second", "admin"}) {
			t.Fatalf("users %q, want [second admin]", users)
		}
		if got[0]["manifestFingerprint"] != fingerprint(next) || got[0]["oldManifestFingerprint"] != fingerprint(w.manifest(manifestOpts{threshold: 2})) {
			t.Fatalf("fingerprints %v", got[0])
		}
	})
	t.Run("the initiator alone", func(t *testing.T) {
		e := &faultEnv{w: w, dir: t.TempDir()}
		e.open(t)
		e.set(t, manifestOpts{threshold: 1})
		next := w.manifest(manifestOpts{threshold: 1, extraSecret: true})
		if res, err := e.c.Update(ctx, w.admin.peer(), next); err != nil || res.MissingAcknowledgments != 0 {
			t.Fatalf("updating: %+v, %v", res, err)
		}
		got := logEntries(t, e.c, updatelog.MsgManifestChanged)
		if len(got) != 1 {
			t.Fatalf("%d manifest changed entries", len(got))
		}
		if users := stringsOf(t, got[0]["users"]); len(users) != 0 {
			t.Fatalf("users %q, want none", users)
		}
	})
}
