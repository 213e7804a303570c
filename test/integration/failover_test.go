package integration

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/cli"
)

// TestClientFailsOverAcrossInstances drives the real Coordinator through the
// SDK and the CLI with address lists: a refused address before it is
// skipped; after a SIGKILL and a restart on the same sealed state (a new
// port, the same root), a client that lists the dead and the new address
// reads and writes through the new one; the Coordinator's refusals are not
// failed over; an instance of another deployment in the list is refused.
func TestClientFailsOverAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startCoordinator(t, "")
	closed := closedLoopbackAddr(t)

	att, err := client.VerifyCoordinator(ctx, closed+","+c.addr, client.VerifyOptions{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("VerifyCoordinator over a refused and a live address: %v", err)
	}
	root := att.Root
	sdk, err := client.New(closed+","+c.addr, client.WithRootCertificate(root))
	if err != nil {
		t.Fatal(err)
	}
	fx := newFixture(t)
	raw := fx.bytes(t)
	if _, err := sdk.SetManifest(ctx, raw); err != nil {
		t.Fatalf("SetManifest: %v", err)
	}
	// The Coordinator's refusal is final: a 409, not a connection failure.
	if _, err := sdk.SetManifest(ctx, raw); !client.IsConflict(err) || errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("second SetManifest: %v, want the Coordinator's 409", err)
	}

	dead := c.addr
	c.restart() // SIGKILL; the new process listens on another port
	if c.addr == dead {
		t.Skip("the restarted Coordinator got the same port")
	}
	alice := fx.users["alice"].cert
	sdk, err = client.New(dead+","+c.addr, client.WithRootCertificate(root), client.WithClientCertificate(alice))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sdk.Status(ctx)
	if err != nil || st.Code != client.StateAcceptingMarbles {
		t.Fatalf("Status over the dead and the restarted address: %+v, %v", st, err)
	}
	m, err := sdk.GetManifest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.VerifyManifest(root, m); err != nil || !bytes.Equal(m.Manifest, raw) {
		t.Fatalf("manifest after failing over: %v", err)
	}
	key := bytes.Repeat([]byte{7}, 32)
	if err := sdk.SetSecrets(ctx, map[string]v2.UserSecret{"userkey": {Key: key}}); err != nil {
		t.Fatalf("SetSecrets after failing over: %v", err)
	}
	got, err := sdk.GetSecrets(ctx, "userkey")
	if err != nil || !bytes.Equal(got["userkey"].Private, key) {
		t.Fatalf("GetSecrets: %v", err)
	}

	// The CLI, with the list in QUARRY_COORDINATOR.
	rootFile := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(rootFile, pemCert(root), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	env := map[string]string{cli.EnvCoordinator: dead + "," + c.addr}
	code := cli.Run(ctx, cli.Params{
		Args: []string{"status", "--root", rootFile}, Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string { return env[k] },
	})
	if code != cli.ExitOK || !strings.HasPrefix(stdout.String(), "3: ") {
		t.Fatalf("quarry status over %s: exit %d %q %q", env[cli.EnvCoordinator], code, stdout.String(), stderr.String())
	}

	// Another deployment's instance first in the list: refused, not skipped.
	foreign := startCoordinator(t, "")
	other, err := client.New(foreign.addr+","+c.addr, client.WithRootCertificate(root))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Status(ctx); !errors.Is(err, client.ErrRootMismatch) {
		t.Fatalf("another deployment in the list: %v, want ErrRootMismatch", err)
	}
}

// closedLoopbackAddr returns a loopback address on which nothing listens.
func closedLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
