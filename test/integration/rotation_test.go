package integration

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
)

// rotationSecrets is what testapp saw of the secrets in one activation:
// each secret's current value and its .Previous value, in hex.
type rotationSecrets struct {
	shared, sharedPrev string // a shared symmetric key
	mine, minePrev     string // a per-Marble symmetric key (derived from the root secret)
	cert, certPrev     string // a shared certificate
}

// TestRootSecretRotation runs a real Marble through full updates that
// rotate the root secret, then do not, then do again (MarbleRun's rule,
// docs/client-api.md, "Secrets across full updates"): a symmetric key changes only when the root
// secret rotates, and its .Previous value then becomes the value before the
// rotation; an update that rotates nothing keeps both the key and its
// .Previous exactly as they were, also across a restart. A certificate is
// re-issued by every full update (the intermediate CA changes) and its
// .Previous is then the certificate it replaced.
func TestRootSecretRotation(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	manifest := func(rotate bool) []byte {
		doc := map[string]any{
			"Packages": map[string]any{"pkg": map[string]any{"SignerID": hexA, "ProductID": 1, "SecurityVersion": 1}},
			"Marbles": map[string]any{"app": map[string]any{"Package": "pkg", "Parameters": map[string]any{
				"Env": map[string]any{
					"SHARED":      "{{hex .Secrets.shared.Private}}",
					"SHARED_PREV": "{{hex .Previous.Secrets.shared.Private}}",
					"MINE":        "{{hex .Secrets.mine.Private}}",
					"MINE_PREV":   "{{hex .Previous.Secrets.mine.Private}}",
					"CERT":        "{{hex .Secrets.cert.Public}}",
					"CERT_PREV":   "{{hex .Previous.Secrets.cert.Public}}",
				},
				"Argv": []string{"testapp", "-env", "SHARED,SHARED_PREV,MINE,MINE_PREV,CERT,CERT_PREV", "-out", "report.json"},
			}}},
			"Secrets": map[string]any{
				"shared": map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true},
				"mine":   map[string]any{"Type": "symmetric-key", "Size": 256},
				"cert":   map[string]any{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
			},
			"Users":  map[string]any{"admin": map[string]any{"Certificate": adminPEM, "Roles": []string{"updater"}}},
			"Roles":  map[string]any{"updater": map[string]any{"ResourceType": "Manifest", "Actions": []string{"UpdateManifest"}}},
			"Config": map[string]any{"UpdateThreshold": 1, "RotateRootSecret": rotate},
		}
		raw, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	update := func(rotate bool) {
		t.Helper()
		r := do(t, c.client(root, &admin), http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": manifest(rotate)})
		expect(t, r, http.StatusOK, "success")
		var d updateData
		decode(t, r, &d)
		if d.MissingAcknowledgments != 0 {
			t.Fatalf("the update is pending (%d acknowledgements missing); threshold 1 applies it at once", d.MissingAcknowledgments)
		}
	}
	// One UUID file for all runs: the per-Marble key depends on the UUID.
	run := marbleRun{typ: "app", uuidFile: filepath.Join(t.TempDir(), "uuid")}
	activate := func() rotationSecrets {
		t.Helper()
		r, _ := run.mustRun(t, c)
		return rotationSecrets{
			shared: r.env(t, "SHARED"), sharedPrev: r.env(t, "SHARED_PREV"),
			mine: r.env(t, "MINE"), minePrev: r.env(t, "MINE_PREV"),
			cert: r.env(t, "CERT"), certPrev: r.env(t, "CERT_PREV"),
		}
	}
	same := func(step, what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %s is %.16s…, want %.16s…", step, what, got, want)
		}
	}
	differ := func(step, what, got, before string) {
		t.Helper()
		if got == before {
			t.Errorf("%s: %s did not change (%.16s…)", step, what, got)
		}
	}

	expect(t, setManifest(t, c, hc, manifest(false)), http.StatusOK, "success")
	s0 := activate()
	same("before any update", ".Previous of the shared key", s0.sharedPrev, s0.shared)
	same("before any update", ".Previous of the per-Marble key", s0.minePrev, s0.mine)
	same("before any update", ".Previous of the certificate", s0.certPrev, s0.cert)

	// (a) The root secret rotates: both keys change, .Previous is the value
	// before.
	update(true)
	sa := activate()
	differ("(a) rotation", "the shared key", sa.shared, s0.shared)
	same("(a) rotation", ".Previous of the shared key", sa.sharedPrev, s0.shared)
	differ("(a) rotation", "the per-Marble key", sa.mine, s0.mine)
	same("(a) rotation", ".Previous of the per-Marble key", sa.minePrev, s0.mine)
	differ("(a) rotation", "the certificate", sa.cert, s0.cert)
	same("(a) rotation", ".Previous of the certificate", sa.certPrev, s0.cert)

	// (b) A full update that does not rotate: the keys and their .Previous
	// stay as after (a); the certificate is re-issued.
	update(false)
	sb := activate()
	same("(b) no rotation", "the shared key", sb.shared, sa.shared)
	same("(b) no rotation", ".Previous of the shared key", sb.sharedPrev, sa.sharedPrev)
	same("(b) no rotation", "the per-Marble key", sb.mine, sa.mine)
	same("(b) no rotation", ".Previous of the per-Marble key", sb.minePrev, sa.minePrev)
	differ("(b) no rotation", "the certificate", sb.cert, sa.cert)
	same("(b) no rotation", ".Previous of the certificate", sb.certPrev, sa.cert)

	// The same after a restart: the previous values are sealed state.
	c.restart()
	sr := activate()
	same("(b) after a restart", "the shared key", sr.shared, sb.shared)
	same("(b) after a restart", ".Previous of the shared key", sr.sharedPrev, sb.sharedPrev)
	same("(b) after a restart", "the per-Marble key", sr.mine, sb.mine)
	same("(b) after a restart", ".Previous of the per-Marble key", sr.minePrev, sb.minePrev)
	same("(b) after a restart", ".Previous of the certificate", sr.certPrev, sb.certPrev)

	// (a) again: the keys change once more, and .Previous is the value the
	// updates before kept (not the one from before the first rotation).
	update(true)
	sa2 := activate()
	differ("(a) again", "the shared key", sa2.shared, sb.shared)
	same("(a) again", ".Previous of the shared key", sa2.sharedPrev, sb.shared)
	differ("(a) again", "the per-Marble key", sa2.mine, sb.mine)
	same("(a) again", ".Previous of the per-Marble key", sa2.minePrev, sb.mine)
	same("(a) again", ".Previous of the certificate", sa2.certPrev, sb.cert)
}
