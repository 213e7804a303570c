package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/marble"
)

// TestMonotonicCounterHelpers: the counter through the Go SDK
// (client.MonotonicCounter) and through the Marble runtime
// (marble.Credentials, read from a real activation's parameters, and its
// MonotonicCounter and ReadMonotonicCounter) against the real Coordinator:
// previous values, reading without raising or creating, the JSend fail of
// a certificate that is not a Marble's, and a server that is not the
// Coordinator root.
func TestMonotonicCounterHelpers(t *testing.T) {
	ctx := context.Background()
	s := newMarbleSetup(t, "MonotonicCounter")
	p := newTestMarble(t).mustActivate(t, s.c, "backend", marbleUUIDA)
	creds, err := (&marble.Parameters{Env: p.GetEnv()}).Credentials()
	if err != nil {
		t.Fatal(err)
	}
	if creds.MarbleType != "backend" || creds.UUID != marbleUUIDA || !creds.CoordinatorRoot.Equal(s.root) {
		t.Fatalf("credentials: type %q, UUID %q, Coordinator root %v; want backend, %s, the pinned root", creds.MarbleType, creds.UUID, creds.CoordinatorRoot.Subject, marbleUUIDA)
	}

	if v, err := creds.ReadMonotonicCounter(ctx, s.c.addr, "c"); err != nil || v != 0 {
		t.Fatalf("read of a new counter: %d, %v; want 0", v, err)
	}
	if v, err := creds.MonotonicCounter(ctx, s.c.addr, "c", 5); err != nil || v != 0 {
		t.Fatalf("raise to 5: previous %d, %v; want 0", v, err)
	}
	if v, err := creds.MonotonicCounter(ctx, s.c.addr, "c", 3); err != nil || v != 5 {
		t.Fatalf("raise to 3: previous %d, %v; want 5", v, err)
	}
	if v, err := creds.ReadMonotonicCounter(ctx, s.c.addr, "c"); err != nil || v != 5 {
		t.Fatalf("read: %d, %v; want 5", v, err)
	}

	sdk, err := client.New(s.c.addr, client.WithRootCertificate(creds.CoordinatorRoot), client.WithClientCertificate(creds.Certificate))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sdk.MonotonicCounter(ctx, "c", 7); err != nil || v != 5 {
		t.Fatalf("client.MonotonicCounter to 7: previous %d, %v; want 5", v, err)
	}
	if v, err := sdk.MonotonicCounter(ctx, "c", 0); err != nil || v != 7 {
		t.Fatalf("client.MonotonicCounter read: %d, %v; want 7", v, err)
	}

	// A manifest user is no Marble: 401 fail, through both.
	admin, err := client.New(s.c.addr, client.WithRootCertificate(s.root), client.WithClientCertificate(s.admin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.MonotonicCounter(ctx, "c", 9); !client.IsUnauthorized(err) {
		t.Errorf("client.MonotonicCounter as a user: %v, want 401", err)
	}
	notMarble := *creds
	notMarble.Certificate = s.admin
	var ce *marble.CounterError
	if _, err := notMarble.MonotonicCounter(ctx, s.c.addr, "c", 9); !errors.As(err, &ce) || ce.HTTPStatus != 401 || ce.Status != "fail" {
		t.Errorf("marble MonotonicCounter as a user: %v, want a 401 fail CounterError", err)
	}
	// Credentials of another Coordinator (another root) do not trust it.
	other := *creds
	other.CoordinatorRoot = creds.MarbleRoot
	if _, err := other.MonotonicCounter(ctx, s.c.addr, "c", 9); !errors.Is(err, marble.ErrNotCoordinatorRoot) {
		t.Errorf("with another root: %v, want ErrNotCoordinatorRoot", err)
	}
	if v, err := sdk.MonotonicCounter(ctx, "c", 0); err != nil || v != 7 {
		t.Fatalf("after the refusals: %d, %v; want 7", v, err)
	}
}
