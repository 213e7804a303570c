package cli

import (
	"fmt"
	"io"
	"os"
	"time"
)

// Timing of the progress line (variables for tests).
var (
	progressDelay = time.Second // nothing is shown for requests quicker than this
	progressTick  = time.Second
)

// isTerminal reports whether w is a terminal (a character device; /dev/null
// is one too, where the line does no harm).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress shows on standard error, when it is a terminal and the output is
// text, that the command waits for the Coordinator: what for and since
// when, rewritten in place every progressTick once progressDelay has
// passed. Generating a manifest's secrets can take long (an RSA-4096 key
// takes about a second), and the request gives no other sign of life. The
// returned function ends it and clears the line; call it before writing
// anything else.
func (a *app) progress(what string) (done func()) {
	if !a.errTerminal || a.jsonOutput() {
		return func() {}
	}
	stop, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		t := time.NewTicker(progressTick)
		defer t.Stop()
		shown := false
		for {
			select {
			case <-stop:
				if shown {
					fmt.Fprint(a.errw, "\r\033[K")
				}
				return
			case <-t.C:
				if d := time.Since(start); d >= progressDelay {
					fmt.Fprintf(a.errw, "\r\033[Kquarry: %s… %s", what, d.Round(time.Second))
					shown = true
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-finished
	}
}
