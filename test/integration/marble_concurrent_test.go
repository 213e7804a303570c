package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/marble"
)

// The Client API (what `quarry status` and `quarry manifest get` call,
// through the SDK) keeps working while Marbles activate: activations must
// not hold the lock the Client API needs.
func TestClientAPIWhileMarblesActivate(t *testing.T) {
	t.Parallel()
	s := newMarbleSetup(t)
	sdk, err := client.New(s.c.addr, client.WithRootCertificate(s.root))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const marbles, rounds = 4, 5
	var wg sync.WaitGroup
	errs := make(chan error, marbles*rounds)
	for i := range marbles {
		dir := t.TempDir()
		wg.Go(func() {
			for r := range rounds {
				p, err := marble.Activate(ctx, marble.Options{
					MarbleType: "backend", CoordinatorAddr: s.c.meshAddr,
					UUIDFile: dir + "/uuid", Attempts: 1,
				})
				if err == nil && len(p.Env["SHARED"]) == 0 {
					err = fmt.Errorf("marble %d round %d: no SHARED in the environment", i, r)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	reads := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running || reads < 10; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		st, err := sdk.Status(ctx)
		if err != nil || st.Code != 3 {
			t.Fatalf("status while Marbles activate: %+v, %v", st, err)
		}
		m, err := sdk.GetManifest(ctx)
		if err != nil || len(m.Manifest) == 0 {
			t.Fatalf("manifest while Marbles activate: %v", err)
		}
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d status and manifest reads during %d activations", reads, marbles*rounds)
}
