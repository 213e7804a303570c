package marble_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/marble"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// TestActivateUUID: the Parameters carry the UUID that was sent, the same
// on a restart with the same UUID file.
func TestActivateUUID(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	opts := options(t, coord)
	first, err := marble.Activate(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(opts.UUIDFile)
	if err != nil {
		t.Fatal(err)
	}
	if first.UUID == "" || first.UUID != string(file) || first.UUID != coord.Requests()[0].UUID {
		t.Errorf("UUID = %q, want the one sent and stored: %q", first.UUID, file)
	}
	again, err := marble.Activate(context.Background(), opts)
	if err != nil || again.UUID != first.UUID {
		t.Errorf("restart: UUID %q, %v; want %q", again.UUID, err, first.UUID)
	}
}

// TestRefusalPredicates: IsRefused and IsMaxActivations for the
// Coordinator's answers, without gRPC codes.
func TestRefusalPredicates(t *testing.T) {
	for name, tc := range map[string]struct {
		err          error
		refused, max bool
	}{
		"max activations": {status.Error(codes.PermissionDenied, `marble verification failed: reached max activations count (1) for marble type "backend"`), true, true},
		"unknown type":    {status.Error(codes.PermissionDenied, "marble verification failed: unknown marble type requested"), true, false},
		"template":        {status.Error(codes.Internal, "customizing marble parameters: file /f: tried to parse secret with empty value"), true, false},
		"bad UUID":        {status.Error(codes.InvalidArgument, "invalid UUID"), true, false},
		"unreachable":     {status.Error(codes.Unavailable, "connection refused"), false, false},
		"not ready":       {status.Error(codes.FailedPrecondition, "cannot accept marbles in current state"), false, false},
	} {
		t.Run(name, func(t *testing.T) {
			coord := marbletest.New(t, func(marbletest.Request) (*marblepb.Parameters, error) { return nil, tc.err })
			opts := options(t, coord)
			opts.Attempts = 2
			_, err := marble.Activate(context.Background(), opts)
			if err == nil {
				t.Fatal("activation succeeded")
			}
			if got := marble.IsRefused(err); got != tc.refused {
				t.Errorf("IsRefused(%v) = %v, want %v", err, got, tc.refused)
			}
			if got := marble.IsMaxActivations(err); got != tc.max {
				t.Errorf("IsMaxActivations(%v) = %v, want %v", err, got, tc.max)
			}
			if tc.refused && len(coord.Requests()) != 1 {
				t.Errorf("a refusal was tried %d times", len(coord.Requests()))
			}
		})
	}
	if marble.IsRefused(errors.New("reached max activations count")) || marble.IsMaxActivations(errors.New("reached max activations count")) {
		t.Error("a plain error counts as the Coordinator's refusal")
	}
	if !strings.Contains(marble.ErrMaxActivations.Error(), "MaxActivations") {
		t.Error("ErrMaxActivations does not name MaxActivations")
	}
}
