package core

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
	"github.com/quarry-cc/quarry/internal/seal"
)

func certFromPEM(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// migratePending migrates a crafted MarbleRun state with a pending
// multi-party update.
func migratePending(t *testing.T, legacy bool) (*Core, stores, *mrVector, *marbleruntest.PendingState, []*x509.Certificate) {
	t.Helper()
	v := readVector(t, "single")
	ps := v.WithPendingUpdate(t, legacy)
	s := newStores()
	s.data.Save(context.Background(), ps.Data, "")
	s.key.Save(context.Background(), v.key, "")
	// The dry run reports it.
	if rep, err := InspectMigration(context.Background(), s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunAuto); err != nil || !rep.PendingUpdate {
		t.Fatalf("dry run: %+v %v", rep, err)
	}
	c, err := migrateCore(t, s)
	if err != nil {
		t.Fatal(err)
	}
	return c, s, v, ps, []*x509.Certificate{certFromPEM(t, ps.AliceCertPEM)}
}

// checkPending: the migrated pending update is the crafted one, waiting
// for alice only.
func checkPending(t *testing.T, c *Core, ps *marbleruntest.PendingState) {
	t.Helper()
	p, err := c.PendingUpdate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Manifest, ps.Update) || !slices.Equal(p.MissingUsers, []string{"alice"}) || p.MissingAcknowledgments != 1 {
		t.Fatalf("pending update: missing users %v, missing acknowledgements %d, manifest equal %v", p.MissingUsers, p.MissingAcknowledgments, bytes.Equal(p.Manifest, ps.Update))
	}
}

// TestMigratePendingUpdate: MarbleRun's pending multi-party update (admin
// initiated, alice has not acknowledged) is migrated: shown with the right
// missing acknowledgement, kept across a restart, admin's acknowledgement
// counts as given, and alice's applies it. Also for a pendingUpdate without
// missingAcknowledgments (older MarbleRun versions), where MarbleRun counts
// the users that have not acknowledged.
func TestMigratePendingUpdate(t *testing.T) {
	for name, legacy := range map[string]bool{"current": false, "without missingAcknowledgments": true} {
		t.Run(name, func(t *testing.T) {
			c, s, v, ps, alice := migratePending(t, legacy)
			ctx := context.Background()
			admin := []*x509.Certificate{v.admin}
			checkPending(t, c, ps)
			m, err := c.Manifest()
			if err != nil || !bytes.Equal(m.Raw, ps.Manifest) {
				t.Fatalf("current manifest: %v", err)
			}
			// A restart opens the Quarry state with the update still pending.
			c, err = migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			checkPending(t, c, ps)
			// admin acknowledged in MarbleRun: again changes nothing.
			res, err := c.AcknowledgeUpdate(ctx, admin, ps.Update)
			if err != nil || !res.AlreadyAcknowledged || res.MissingAcknowledgments != 1 {
				t.Fatalf("admin's repeated acknowledgement: %+v %v", res, err)
			}
			// Another update while it is pending is refused.
			if _, err := c.Update(ctx, admin, []byte(`{"Packages":{"backend":{"SecurityVersion":3}}}`)); !errors.Is(err, ErrConflict) {
				t.Fatalf("update while pending: %v", err)
			}
			// Different bytes are refused.
			if _, err := c.AcknowledgeUpdate(ctx, alice, append(bytes.Clone(ps.Update), ' ')); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("acknowledging other bytes: %v", err)
			}
			checkPending(t, c, ps)
			// alice's acknowledgement applies it.
			res, err = c.AcknowledgeUpdate(ctx, alice, ps.Update)
			if err != nil || res.MissingAcknowledgments != 0 || len(res.MissingUsers) != 0 {
				t.Fatalf("alice's acknowledgement: %+v %v", res, err)
			}
			if _, err := c.PendingUpdate(ctx); !errors.Is(err, ErrNotFound) {
				t.Fatalf("still pending after the last acknowledgement: %v", err)
			}
			for _, core := range []*Core{c, mustCore(t, s)} {
				m, err := core.Manifest()
				if err != nil || !bytes.Equal(m.Raw, ps.Update) {
					t.Fatalf("the update is not applied: %v", err)
				}
				got, err := core.Secrets(ctx, admin, []string{"symKey128Shared"})
				if err != nil || len(got["symKey128Shared"].Private) != 16 {
					t.Fatalf("secrets after the update: %v", err)
				}
				if _, ok := core.snap.Load().persisted.Secrets["newKey"]; !ok {
					t.Error("the update's new secret was not generated")
				}
				log, _ := core.UpdateLog(ctx)
				if n := len(log); n < 3 || !strings.Contains(log[n-3], "initiated by user") ||
					!strings.Contains(log[n-2], "acknowledged by user") || !strings.Contains(log[n-2], `"alice"`) ||
					!strings.Contains(log[n-1], "Complete Manifest updated") {
					t.Errorf("update log tail: %q", log[max(n-3, 0):])
				}
			}
		})
	}
}

// TestMigratePendingUpdateCancel: after the migration, a user holding
// UpdateManifest cancels MarbleRun's pending update; the manifest stays.
func TestMigratePendingUpdateCancel(t *testing.T) {
	for _, who := range []string{"alice", "admin"} {
		t.Run(who, func(t *testing.T) {
			c, s, v, ps, alice := migratePending(t, false)
			ctx := context.Background()
			peer := alice
			if who == "admin" {
				peer = []*x509.Certificate{v.admin}
			}
			if err := c.CancelUpdate(ctx, peer); err != nil {
				t.Fatal(err)
			}
			for _, core := range []*Core{c, mustCore(t, s)} {
				if _, err := core.PendingUpdate(ctx); !errors.Is(err, ErrNotFound) {
					t.Fatalf("pending after cancel: %v", err)
				}
				m, _ := core.Manifest()
				if !bytes.Equal(m.Raw, ps.Manifest) {
					t.Error("the manifest changed")
				}
				log, _ := core.UpdateLog(ctx)
				var last struct{ Update, User string }
				json.Unmarshal([]byte(log[len(log)-1]), &last)
				if last.Update != "Complete Manifest update cancelled by user" || last.User != who {
					t.Errorf("last log entry %q", log[len(log)-1])
				}
			}
			// A new update can start now (a package update applies at once).
			if _, err := c.Update(ctx, []*x509.Certificate{v.admin}, []byte(`{"Packages":{"backend":{"SecurityVersion":3}}}`)); err != nil {
				t.Fatalf("update after cancel: %v", err)
			}
		})
	}
}

func mustCore(t *testing.T, s stores) *Core {
	t.Helper()
	c, err := migrateCore(t, s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
