// Command vulncanary calls code with a known vulnerability: .ci/run runs
// govulncheck on it with the database it built and expects that finding
// (GO-2022-1059, golang.org/x/text/language.ParseAcceptLanguage before v0.3.8), so that a
// database that finds nothing cannot pass the gate unnoticed.
package main

import (
	"fmt"
	"os"

	"golang.org/x/text/language"
)

func main() {
	tags, _, err := language.ParseAcceptLanguage(os.Args[len(os.Args)-1])
	fmt.Println(tags, err)
}
