package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// goroutinesOf returns the stacks of the running goroutines that are in a
// method of one of the receivers (an *App or *core.Core, by address).
func goroutinesOf(receivers ...any) []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, r := range receivers {
			if strings.Contains(g, fmt.Sprintf("(%p", r)) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// TestRunJoinsItsGoroutines: when Run returns, no goroutine it started
// still runs, whether it returns after a cancel (with a shared store, so
// that the Core follows the other instances) or because the start failed
// while its context lives on.
func TestRunJoinsItsGoroutines(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	env := func(prefix string) map[string]string {
		return map[string]string{
			"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": strings.Join(cluster.Endpoints(), ","), "QUARRY_ETCD_PREFIX": prefix,
			"QUARRY_INSECURE_PEER_TRUST": "1",
		}
	}

	t.Run("cancelled while following", func(t *testing.T) {
		logs := &logBuffer{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		a, err := New(ctx, testConfig(t, env("/lifetime-follow/")), slog.New(slog.NewJSONHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		logs.addr(t, "state loaded; serving")
		c := a.core
		if !c.Shared() {
			t.Fatal("the Core does not share its state: Follow would return at once")
		}
		// Follow runs until the cancel.
		for deadline := time.Now().Add(5 * time.Second); len(goroutinesOf(c)) == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the Core does not follow the shared store")
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if left := goroutinesOf(a, c); len(left) > 0 {
			t.Fatalf("Run returned while %d of its goroutines still run:\n%s", len(left), strings.Join(left, "\n\n"))
		}
	})

	t.Run("start failed", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "manifest.json")
		if err := os.WriteFile(bad, []byte("{not a manifest"), 0o600); err != nil {
			t.Fatal(err)
		}
		e := env("/lifetime-fail/")
		e["EDG_STARTUP_MANIFEST"] = bad
		logs := &logBuffer{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // only after the check: Run returns with ctx alive
		a, err := New(ctx, testConfig(t, e), slog.New(slog.NewJSONHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var serr *StartError
		if err := a.Run(ctx); !errors.As(err, &serr) {
			t.Fatalf("Run with a startup manifest that does not parse: %v, want a StartError", err)
		}
		if left := goroutinesOf(a); len(left) > 0 {
			t.Fatalf("Run returned while %d of its goroutines still run:\n%s", len(left), strings.Join(left, "\n\n"))
		}
	})
}
