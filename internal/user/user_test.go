package user

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/testpki"
	"github.com/quarry-cc/quarry/manifest"
)

// newCert returns a fresh self-signed certificate and its PEM text.
func newCert(t *testing.T, cn string) (*x509.Certificate, string) {
	t.Helper()
	// Expired: identity does not look at validity.
	c := testpki.SelfSigned(t, cn, testpki.Serial(1),
		testpki.Valid(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)))
	return c.Cert, string(c.CertPEM())
}

type fixture struct {
	users                       *Users
	alice, bob, carol, outsider *x509.Certificate
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	var f fixture
	var alicePEM, bobPEM, carolPEM string
	f.alice, alicePEM = newCert(t, "alice")
	f.bob, bobPEM = newCert(t, "bob")
	f.carol, carolPEM = newCert(t, "carol")
	f.outsider, _ = newCert(t, "outsider")
	m := &manifest.Manifest{
		Users: map[string]manifest.User{
			// alice: two secret roles (union) and the manifest role.
			"alice": {Certificate: alicePEM, Roles: []string{"readA", "readB", "admin"}},
			// bob: writes c, reads nothing; updates package p.
			"bob": {Certificate: bobPEM, Roles: []string{"writeC", "pkg"}},
			// carol: no roles at all.
			"carol": {Certificate: carolPEM},
		},
		Roles: map[string]manifest.Role{
			"readA":  {ResourceType: manifest.ResourceSecrets, ResourceNames: []string{"a"}, Actions: []string{"ReadSecret"}},
			"readB":  {ResourceType: manifest.ResourceSecrets, ResourceNames: []string{"b"}, Actions: []string{"readsecret", "WriteSecret"}},
			"writeC": {ResourceType: manifest.ResourceSecrets, ResourceNames: []string{"c"}, Actions: []string{"WRITESECRET"}},
			"pkg":    {ResourceType: manifest.ResourcePackages, ResourceNames: []string{"p"}, Actions: []string{"UpdateSecurityVersion"}},
			"admin":  {ResourceType: manifest.ResourceManifest, Actions: []string{"UpdateManifest"}},
		},
	}
	var err error
	if f.users, err = FromManifest(m); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestAuthorizationMatrix(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name      string
		peer      []*x509.Certificate
		action    string
		resources []string
		wantAuthn bool   // identification fails
		wantErr   string // "" for allowed; else a part of the message
	}{
		{name: "no certificate", peer: nil, action: "ReadSecret", resources: []string{"a"}, wantAuthn: true},
		{name: "nil certificate", peer: []*x509.Certificate{nil}, action: "ReadSecret", resources: []string{"a"}, wantAuthn: true},
		{name: "unknown certificate", peer: []*x509.Certificate{f.outsider}, action: "ReadSecret", resources: []string{"a"}, wantAuthn: true},
		// docs/design/decisions.md#d14: only the leaf identifies; a user's public
		// certificate later in the chain proves nothing.
		{name: "user after an unknown leaf", peer: []*x509.Certificate{f.outsider, f.alice}, action: "ReadSecret", resources: []string{"a"}, wantAuthn: true},
		{name: "user after a nil leaf", peer: []*x509.Certificate{nil, f.alice}, action: "ReadSecret", resources: []string{"a"}, wantAuthn: true},
		{name: "user leaf with more in the chain", peer: []*x509.Certificate{f.alice, f.outsider}, action: "ReadSecret", resources: []string{"a"}},
		{name: "user with the action", peer: []*x509.Certificate{f.alice}, action: "ReadSecret", resources: []string{"a"}},
		{name: "union across roles", peer: []*x509.Certificate{f.alice}, action: "ReadSecret", resources: []string{"a", "b"}},
		{name: "case-insensitive action", peer: []*x509.Certificate{f.alice}, action: "READSECRET", resources: []string{"b", "a"}},
		{name: "action only in one role", peer: []*x509.Certificate{f.alice}, action: "WriteSecret", resources: []string{"b"}},
		{name: "role on another resource", peer: []*x509.Certificate{f.alice}, action: "WriteSecret", resources: []string{"a"},
			wantErr: "user alice is not allowed to set one or more secrets of: [a]"},
		{name: "one resource missing", peer: []*x509.Certificate{f.alice}, action: "ReadSecret", resources: []string{"a", "c", "b"},
			wantErr: "user alice is not allowed to read one or more secrets of: [a c b]"},
		{name: "user without the action", peer: []*x509.Certificate{f.bob}, action: "ReadSecret", resources: []string{"c"},
			wantErr: "user bob is not allowed to read one or more secrets of: [c]"},
		{name: "user without any role", peer: []*x509.Certificate{f.carol}, action: "ReadSecret",
			resources: []string{"a"}, wantErr: "user carol is not allowed to read"},
		{name: "write own secret", peer: []*x509.Certificate{f.bob}, action: "writesecret", resources: []string{"c"}},
		{name: "package update", peer: []*x509.Certificate{f.bob}, action: "UpdateSecurityVersion", resources: []string{"p"}},
		{name: "package update of another package", peer: []*x509.Certificate{f.bob}, action: "UpdateSecurityVersion", resources: []string{"p", "q"},
			wantErr: "user bob is not allowed to update the security version of one or more packages of: [p q]"},
		{name: "Manifest action with no names", peer: []*x509.Certificate{f.alice}, action: "UpdateManifest"},
		{name: "Manifest action, lowercase", peer: []*x509.Certificate{f.alice}, action: "updatemanifest"},
		{name: "Manifest action without the role", peer: []*x509.Certificate{f.bob}, action: "UpdateManifest",
			wantErr: "user bob is not allowed to update the manifest"},
		{name: "action held, empty resource list", peer: []*x509.Certificate{f.bob}, action: "WriteSecret"},
		{name: "resource names are case-sensitive", peer: []*x509.Certificate{f.alice}, action: "ReadSecret", resources: []string{"A"},
			wantErr: "[A]"},
		{name: "unknown action", peer: []*x509.Certificate{f.alice}, action: "SignQuote",
			wantErr: "user alice is not allowed to perform action SignQuote"},
		{name: "unknown action with resources", peer: []*x509.Certificate{f.alice}, action: "Delete", resources: []string{"a"},
			wantErr: "user alice is not allowed to perform action Delete on one or more of: [a]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := f.users.Identify(tt.peer)
			if tt.wantAuthn {
				if !errors.Is(err, ErrUnauthenticated) || u != nil {
					t.Fatalf("Identify = %v, %v; want ErrUnauthenticated", u, err)
				}
				if !strings.HasPrefix(err.Error(), "unauthorized user: client certificate did not match any") {
					t.Errorf("message %q lacks MarbleRun's phrase", err)
				}
				// Authorize refuses the missing user too.
				if err := Authorize(u, tt.action, tt.resources...); !errors.Is(err, ErrUnauthenticated) {
					t.Errorf("Authorize(nil) = %v, want ErrUnauthenticated", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Identify: %v", err)
			}
			err = Authorize(u, tt.action, tt.resources...)
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("Authorize = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrForbidden) {
				t.Fatalf("Authorize = %v, want ErrForbidden", err)
			}
			var fe *ForbiddenError
			if !errors.As(err, &fe) || fe.User != u.Name || fe.Action != tt.action || !slices.Equal(fe.Resources, tt.resources) {
				t.Errorf("ForbiddenError = %+v", fe)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("message %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestIdentifyFirstUserInNameOrder(t *testing.T) {
	cert, p := newCert(t, "shared")
	// The same certificate in a second PEM encoding (headers, CRLF): the
	// manifest's string comparison lets it through, identity sees one DER.
	block, _ := pem.Decode([]byte(p))
	block.Headers = map[string]string{"Comment": "same cert"}
	p2 := strings.ReplaceAll(string(pem.EncodeToMemory(block)), "\n", "\r\n")
	other, otherPEM := newCert(t, "other")
	m := &manifest.Manifest{Users: map[string]manifest.User{
		"zed":   {Certificate: p},
		"mike":  {Certificate: p2},
		"alpha": {Certificate: otherPEM},
	}}
	for range 10 {
		us, err := FromManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		u, err := us.Identify([]*x509.Certificate{cert})
		if err != nil || u.Name != "mike" {
			t.Fatalf("Identify = %v, %v; want mike", u, err)
		}
		// Only the leaf counts (docs/design/decisions.md#d14): the users of later certificates
		// are ignored.
		u, err = us.Identify([]*x509.Certificate{cert, other})
		if err != nil || u.Name != "mike" {
			t.Fatalf("Identify = %v, %v; want mike", u, err)
		}
		u, err = us.Identify([]*x509.Certificate{other, cert})
		if err != nil || u.Name != "alpha" {
			t.Fatalf("Identify = %v, %v; want alpha", u, err)
		}
	}
}

func TestFromManifest(t *testing.T) {
	_, good := newCert(t, "u")
	tests := []struct {
		name    string
		m       *manifest.Manifest
		wantErr string
	}{
		{"nil manifest", nil, ""},
		{"no users", &manifest.Manifest{}, ""},
		{"leading text before the PEM block", &manifest.Manifest{Users: map[string]manifest.User{"u": {Certificate: "comment\n" + good}}}, ""},
		{"not PEM", &manifest.Manifest{Users: map[string]manifest.User{"u": {Certificate: "hello"}}}, "received invalid certificate for user u"},
		{"empty", &manifest.Manifest{Users: map[string]manifest.User{"u": {}}}, "received invalid certificate for user u"},
		{"PEM but not a certificate", &manifest.Manifest{Users: map[string]manifest.User{"u": {
			Certificate: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))}}},
			"received invalid certificate for user u"},
		{"unknown role", &manifest.Manifest{Users: map[string]manifest.User{"u": {Certificate: good, Roles: []string{"ghost"}}}},
			"manifest specifies role ghost for user u, but role does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			us, err := FromManifest(tt.m)
			if tt.wantErr == "" {
				if err != nil || us == nil {
					t.Fatalf("FromManifest = %v, %v", us, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want ErrInvalid with %q", err, tt.wantErr)
			}
		})
	}
}

func TestQueries(t *testing.T) {
	f := newFixture(t)
	if got := f.users.Names(); !slices.Equal(got, []string{"alice", "bob", "carol"}) {
		t.Errorf("Names = %v", got)
	}
	for _, tt := range []struct {
		action string
		want   []string
	}{
		{"UpdateManifest", []string{"alice"}},
		{"updatemanifest", []string{"alice"}},
		{"WriteSecret", []string{"alice", "bob"}},
		{"ReadSecret", []string{"alice"}},
		{"UpdateSecurityVersion", []string{"bob"}},
		{"SignQuote", nil},
	} {
		if got := f.users.WithAction(tt.action); !slices.Equal(got, tt.want) {
			t.Errorf("WithAction(%s) = %v, want %v", tt.action, got, tt.want)
		}
	}
	alice, ok := f.users.Get("alice")
	if !ok || alice.Name != "alice" || !alice.Certificate.Equal(f.alice) {
		t.Fatalf("Get(alice) = %v, %v", alice, ok)
	}
	if got := alice.Resources("readSECRET"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Resources(ReadSecret) = %v", got)
	}
	if got := alice.Resources("UpdateManifest"); got == nil || len(got) != 0 {
		t.Errorf("Resources(UpdateManifest) = %#v, want an empty non-nil list", got)
	}
	if !alice.Has("UPDATEMANIFEST") || alice.Has("UpdateSecurityVersion") {
		t.Error("Has is wrong")
	}
	if _, ok := f.users.Get("nobody"); ok {
		t.Error("Get(nobody) found a user")
	}
	var none *Users
	if _, err := none.Identify([]*x509.Certificate{f.alice}); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("nil Users.Identify = %v", err)
	}
	if none.WithAction("UpdateManifest") != nil || none.Names() != nil {
		t.Error("nil Users has users")
	}
}
