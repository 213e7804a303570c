package console

import (
	"html/template"
	"strings"
	"time"
)

var funcs = template.FuncMap{
	"date": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"iso":  func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"join": strings.Join,
	"short": func(s string) string {
		if len(s) <= 16 {
			return s
		}
		return s[:16] + "…"
	},
	"add": func(a, b int) int { return a + b },
}
