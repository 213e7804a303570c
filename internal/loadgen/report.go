package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a benchmark; its JSON form is the -json output.
type Report struct {
	Target    Target           `json:"target"`
	Settings  Settings         `json:"settings"`
	Manifest  *ManifestInfo    `json:"manifest,omitempty"` // the generated one
	Scenarios []ScenarioResult `json:"scenarios"`
	// Memory is the started Coordinator's after the read scenarios; nil
	// (null) when not available, MemoryNote says why.
	Memory     *Memory `json:"coordinatorMemory"`
	MemoryNote string  `json:"coordinatorMemoryNote,omitempty"`
}

// Target is the Coordinator the read scenarios ran against.
type Target struct {
	Addr    string `json:"addr,omitempty"`
	Started bool   `json:"started"` // by quarry-bench
	// MeshAddr is the Marble API of the activate scenario (-mesh-addr).
	MeshAddr string `json:"meshAddr,omitempty"`
	Binary   string `json:"binary,omitempty"`
	PID      int    `json:"pid,omitempty"`
}

// Settings are the load settings.
type Settings struct {
	Connections     int     `json:"connections"`
	DurationSeconds float64 `json:"durationSeconds"`
	WarmupSeconds   float64 `json:"warmupSeconds"`
	Protocol        string  `json:"protocol"`
	Runs            int     `json:"runs"`
	Machine         string  `json:"machine"`
}

// ScenarioResult is one scenario's outcome. Read scenarios fill the load
// fields; set-manifest counts one request per run and fills RunsSeconds
// (successful runs) and MedianSeconds.
type ScenarioResult struct {
	Name    string `json:"name"`
	Request string `json:"request,omitempty"`
	Skipped string `json:"skipped,omitempty"` // why it did not run

	Requests   int64   `json:"requests"` // responses, any status
	Non2xx     int64   `json:"non2xx"`
	Errors     int64   `json:"errors"`    // transport errors
	ErrorRate  float64 `json:"errorRate"` // (non2xx+errors)/(requests+errors)
	FirstError string  `json:"firstError,omitempty"`

	RequestsPerSecond float64    `json:"requestsPerSecond,omitempty"`
	BytesPerSecond    float64    `json:"bytesPerSecond,omitempty"`
	LatencyMs         *LatencyMs `json:"latencyMs,omitempty"`
	Connections       int64      `json:"connections,omitempty"` // opened
	Protocol          string     `json:"protocol,omitempty"`

	RunsSeconds   []float64 `json:"runsSeconds,omitempty"`
	MedianSeconds float64   `json:"medianSeconds,omitempty"`
}

// LatencyMs is a Latency in milliseconds.
type LatencyMs struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func loadResult(name, request string, r RunResult) ScenarioResult {
	secs := r.Elapsed.Seconds()
	return ScenarioResult{
		Name:              name,
		Request:           request,
		Requests:          r.Requests,
		Non2xx:            r.Non2xx,
		Errors:            r.Errors,
		ErrorRate:         errorRate(r.Requests, r.Non2xx, r.Errors),
		FirstError:        r.FirstError,
		RequestsPerSecond: float64(r.Requests) / secs,
		BytesPerSecond:    float64(r.Bytes) / secs,
		LatencyMs: &LatencyMs{
			Mean: ms(r.Latency.Mean), P50: ms(r.Latency.P50), P90: ms(r.Latency.P90),
			P99: ms(r.Latency.P99), Max: ms(r.Latency.Max),
		},
		Connections: r.Connections,
		Protocol:    r.Protocol,
	}
}

func errorRate(requests, non2xx, errors int64) float64 {
	if requests+errors == 0 {
		return 0
	}
	return float64(non2xx+errors) / float64(requests+errors)
}

// Failures lists the scenarios whose error rate exceeds maxErrorRate (a
// fraction) or that completed no request at all.
func (r *Report) Failures(maxErrorRate float64) []string {
	var out []string
	for _, s := range r.Scenarios {
		switch {
		case s.Skipped != "":
		case s.Requests+s.Errors == 0:
			out = append(out, s.Name+": no request completed")
		case s.ErrorRate > maxErrorRate:
			out = append(out, fmt.Sprintf("%s: error rate %.4g%% (%d non-2xx, %d transport errors) exceeds %.4g%%; e.g. %s",
				s.Name, 100*s.ErrorRate, s.Non2xx, s.Errors, 100*maxErrorRate, s.FirstError))
		}
	}
	return out
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r for people.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	t := r.Target
	switch {
	case t.Started && t.Addr != "":
		fmt.Fprintf(&b, "Coordinator  %s, pid %d, https://%s (started by quarry-bench)\n", t.Binary, t.PID, t.Addr)
	case t.Started:
		fmt.Fprintf(&b, "Coordinator  %s (started by quarry-bench)\n", t.Binary)
	case t.Addr == "":
		fmt.Fprintf(&b, "Coordinator  Marble API %s\n", t.MeshAddr)
	default:
		fmt.Fprintf(&b, "Coordinator  https://%s\n", t.Addr)
	}
	if t.Addr != "" && t.MeshAddr != "" {
		fmt.Fprintf(&b, "Marble API   %s\n", t.MeshAddr)
	}
	s := r.Settings
	fmt.Fprintf(&b, "Load         %d connections, %s, %gs per scenario after %gs warm-up\n",
		s.Connections, s.Protocol, s.DurationSeconds, s.WarmupSeconds)
	fmt.Fprintf(&b, "Machine      %s\n", s.Machine)
	if m := r.Manifest; m != nil {
		fmt.Fprintf(&b, "Manifest     %d bytes, %d packages, %d Marbles, %d shared secrets (%d cert-rsa 2048, %d cert-ecdsa P-256, %d cert-ed25519, %d symmetric-key 256)\n",
			m.Bytes, m.Packages, m.Marbles, m.Secrets, m.Mix.RSA, m.Mix.ECDSA, m.Mix.Ed25519, m.Mix.Symmetric)
	}
	b.WriteString("\n")

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	// tabwriter aligns every column right; the names are padded to stay left.
	fmt.Fprintf(tw, "%-*s\trequests\treq/s\tp50\tp90\tp99\tmax\tnon-2xx\terrors\tconns\t\n", nameWidth, "scenario")
	var notes []string
	for _, sc := range r.Scenarios {
		switch {
		case sc.Skipped != "":
			notes = append(notes, fmt.Sprintf("%s: skipped: %s", sc.Name, sc.Skipped))
		case sc.LatencyMs != nil:
			l := sc.LatencyMs
			fmt.Fprintf(tw, "%-*s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", nameWidth, sc.Name, sc.Requests, sc.RequestsPerSecond,
				fmtMs(l.P50), fmtMs(l.P90), fmtMs(l.P99), fmtMs(l.Max), sc.Non2xx, sc.Errors, sc.Connections)
		}
		if sc.Skipped == "" && sc.FirstError != "" {
			notes = append(notes, fmt.Sprintf("%s: first error: %s", sc.Name, sc.FirstError))
		}
	}
	tw.Flush()
	for _, sc := range r.Scenarios {
		if sc.Name != ScenarioSetManifest || sc.Skipped != "" {
			continue
		}
		runs := make([]string, len(sc.RunsSeconds))
		for i, v := range sc.RunsSeconds {
			runs[i] = fmt.Sprintf("%.3fs", v)
		}
		fmt.Fprintf(&b, "\nset-manifest  POST %s: %d runs on fresh Coordinators: %s", "/api/v2/manifest", sc.Requests, strings.Join(runs, " "))
		if len(runs) > 0 {
			fmt.Fprintf(&b, "; median %.3fs", sc.MedianSeconds)
		}
		if failed := sc.Non2xx + sc.Errors; failed > 0 {
			fmt.Fprintf(&b, "; %d failed", failed)
		}
		b.WriteString("\n")
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	if r.Memory != nil {
		fmt.Fprintf(&b, "\nCoordinator resident memory after load: %.1f MiB (VmRSS; peak VmHWM %.1f MiB)\n",
			mib(r.Memory.RSS), mib(r.Memory.Peak))
	} else {
		fmt.Fprintf(&b, "\nCoordinator resident memory after load: %s\n", r.MemoryNote)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// nameWidth is the width of the longest scenario name.
const nameWidth = len(activateShared)

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// fmtMs prints milliseconds with three significant digits.
func fmtMs(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	default:
		return fmt.Sprintf("%.2fms", v)
	}
}
