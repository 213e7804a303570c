package app

import (
	"testing"

	"github.com/quarry-cc/quarry/internal/admission"
	"github.com/quarry-cc/quarry/internal/config"
)

func TestClientLimits(t *testing.T) {
	for _, tc := range []struct {
		cfg    config.ClientLimits
		nofile uint64
		want   admission.Limits
	}{
		// Half of what the reserve leaves, a quarter of that per source.
		{config.ClientLimits{}, 512, admission.Limits{MaxConns: 224, MaxPerSource: 56}},
		{config.ClientLimits{}, 1024, admission.Limits{MaxConns: 480, MaxPerSource: 64}},
		{config.ClientLimits{}, 1 << 20, admission.Limits{MaxConns: 4096, MaxPerSource: 64}},
		{config.ClientLimits{}, 0, admission.Limits{MaxConns: 4096, MaxPerSource: 64}}, // unknown
		{config.ClientLimits{}, 1 << 62, admission.Limits{MaxConns: 4096, MaxPerSource: 64}},
		{config.ClientLimits{}, 70, admission.Limits{MaxConns: 4, MaxPerSource: 1}},
		// Configured values win; per source never above the total.
		{config.ClientLimits{MaxConns: 100, MaxPerSource: 10}, 512, admission.Limits{MaxConns: 100, MaxPerSource: 10}},
		{config.ClientLimits{MaxConns: 10, MaxPerSource: 50}, 512, admission.Limits{MaxConns: 10, MaxPerSource: 10}},
		{config.ClientLimits{MaxPerSource: 500}, 512, admission.Limits{MaxConns: 224, MaxPerSource: 224}},
	} {
		if got := clientLimits(tc.cfg, tc.nofile); got != tc.want {
			t.Errorf("clientLimits(%+v, %d) = %+v, want %+v", tc.cfg, tc.nofile, got, tc.want)
		}
	}
}
