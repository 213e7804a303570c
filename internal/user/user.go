// Package user holds the manifest's users and their permissions, identifies
// the user behind a client certificate, and decides whether a user may
// perform an action on named resources (docs/design/behaviour.md#users-and-permissions).
//
// A permission is the lowercase action name (for example "readsecret")
// with a resource set: the union of the ResourceNames of all the user's
// roles that grant the action. ResourceType is not part of a permission.
// Authorize is the one check every endpoint makes.
package user

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quarry-cc/quarry/manifest"
)

var (
	// ErrUnauthenticated: no client certificate, or none that belongs to a
	// manifest user (401). The text is MarbleRun's.
	ErrUnauthenticated = errors.New("unauthorized user: client certificate did not match any users")
	// ErrForbidden: the user lacks the action or a resource (403); errors.As
	// with *ForbiddenError tells which.
	ErrForbidden = errors.New("forbidden")
	// ErrInvalid: the manifest's users cannot be built (a certificate does
	// not parse, or a role is missing).
	ErrInvalid = errors.New("invalid users")
)

// ForbiddenError reports a refused action. It wraps ErrForbidden.
type ForbiddenError struct {
	User      string
	Action    string   // as asked, e.g. "ReadSecret"
	Resources []string // the requested resources, in request order
}

func (e *ForbiddenError) Error() string {
	what := ""
	switch strings.ToLower(e.Action) {
	case "readsecret":
		what = "read one or more secrets of"
	case "writesecret":
		what = "set one or more secrets of"
	case "updatesecurityversion":
		what = "update the security version of one or more packages of"
	case "updatemanifest":
		if len(e.Resources) == 0 {
			return fmt.Sprintf("user %s is not allowed to update the manifest", e.User)
		}
		what = "update the manifest for"
	default:
		if len(e.Resources) == 0 {
			return fmt.Sprintf("user %s is not allowed to perform action %s", e.User, e.Action)
		}
		what = fmt.Sprintf("perform action %s on one or more of", e.Action)
	}
	return fmt.Sprintf("user %s is not allowed to %s: [%s]", e.User, what, strings.Join(e.Resources, " "))
}

// Unwrap returns ErrForbidden.
func (e *ForbiddenError) Unwrap() error { return ErrForbidden }

var _ error = (*ForbiddenError)(nil)

// User is a manifest user with its certificate and permissions. It is
// immutable and safe for concurrent use.
type User struct {
	Name        string
	Certificate *x509.Certificate
	// permissions maps a lowercase action to the set of resource names.
	permissions map[string]map[string]struct{}
}

// Has reports whether the user holds action (case-insensitive), whatever
// the resources.
func (u *User) Has(action string) bool {
	if u == nil {
		return false
	}
	_, ok := u.permissions[strings.ToLower(action)]
	return ok
}

// Resources returns the sorted resource names the user may act on with
// action (case-insensitive); nil if the user lacks the action.
func (u *User) Resources(action string) []string {
	if u == nil {
		return nil
	}
	set, ok := u.permissions[strings.ToLower(action)]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Authorize is the single authorisation check. It returns nil when u holds
// action (compared case-insensitively) and every named resource is in the
// action's resource set; with no resources, holding the action suffices.
// Otherwise it returns a *ForbiddenError (wrapping ErrForbidden) naming the
// user, the action and the resources, or ErrUnauthenticated when u is nil.
func Authorize(u *User, action string, resources ...string) error {
	if u == nil {
		return ErrUnauthenticated
	}
	set, ok := u.permissions[strings.ToLower(action)]
	if ok {
		for _, r := range resources {
			if _, ok = set[r]; !ok {
				break
			}
		}
	}
	if !ok {
		return &ForbiddenError{User: u.Name, Action: action, Resources: slices.Clone(resources)}
	}
	return nil
}

// Users are the users of one manifest. They are immutable and safe for
// concurrent use; a manifest update makes a new Users.
type Users struct {
	names  []string         // sorted
	byName map[string]*User //
	byDER  map[string]*User // certificate DER -> first user in name order
}

// FromManifest builds the users of m: each user's certificate is the first
// PEM block of its Certificate, parsed as X.509 (any certificate works:
// expiry, issuer and key usage are not checked), and its permissions come
// from its roles. A nil manifest has no users.
func FromManifest(m *manifest.Manifest) (*Users, error) {
	us := &Users{byName: map[string]*User{}, byDER: map[string]*User{}}
	if m == nil {
		return us, nil
	}
	for name := range m.Users {
		us.names = append(us.names, name)
	}
	slices.Sort(us.names)

	for _, name := range us.names {
		mu := m.Users[name]
		block, _ := pem.Decode([]byte(mu.Certificate))
		if block == nil {
			return nil, fmt.Errorf("%w: received invalid certificate for user %s: no PEM block", ErrInvalid, name)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: received invalid certificate for user %s: %w", ErrInvalid, name, err)
		}
		u := &User{Name: name, Certificate: cert, permissions: map[string]map[string]struct{}{}}
		for _, roleName := range mu.Roles {
			role, ok := m.Roles[roleName]
			if !ok {
				return nil, fmt.Errorf("%w: manifest specifies role %s for user %s, but role does not exist", ErrInvalid, roleName, name)
			}
			for _, action := range role.Actions {
				id := strings.ToLower(action)
				set, ok := u.permissions[id]
				if !ok {
					set = map[string]struct{}{}
					u.permissions[id] = set
				}
				for _, r := range role.ResourceNames {
					set[r] = struct{}{}
				}
			}
		}
		us.byName[name] = u
		if _, taken := us.byDER[string(cert.Raw)]; !taken {
			us.byDER[string(cert.Raw)] = u
		}
	}
	return us, nil
}

// Identify returns the user whose certificate is byte-equal (DER) to the
// leaf of the presented chain, peer[0]: of the users with that certificate,
// the first in name order. Only the leaf counts (docs/design/decisions.md#d14): TLS proves
// possession of the leaf's private key alone, and user certificates are
// public, so a user's certificate later in the chain proves nothing. There
// is no chain, expiry or key-usage check, as in MarbleRun. No certificate,
// or a leaf that matches nobody, gives ErrUnauthenticated whatever follows.
func (us *Users) Identify(peer []*x509.Certificate) (*User, error) {
	if us == nil || len(peer) == 0 || peer[0] == nil {
		return nil, ErrUnauthenticated
	}
	u, ok := us.byDER[string(peer[0].Raw)]
	if !ok {
		return nil, ErrUnauthenticated
	}
	return u, nil
}

// Get returns the user called name.
func (us *Users) Get(name string) (*User, bool) {
	if us == nil {
		return nil, false
	}
	u, ok := us.byName[name]
	return u, ok
}

// Names returns the sorted names of all users.
func (us *Users) Names() []string {
	if us == nil {
		return nil
	}
	return slices.Clone(us.names)
}

// WithAction returns the sorted names of the users holding action
// (case-insensitive), whatever its resources: for example the users who
// must acknowledge a manifest update hold "UpdateManifest".
func (us *Users) WithAction(action string) []string {
	if us == nil {
		return nil
	}
	var out []string
	for _, name := range us.names {
		if us.byName[name].Has(action) {
			out = append(out, name)
		}
	}
	return out
}
