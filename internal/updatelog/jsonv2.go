//go:build goexperiment.jsonv2

package updatelog

// The update log's entries are hashed into a chain, so their bytes must not
// change with the Go release: encoding/json as Go 1.27 builds it by default
// (GOEXPERIMENT=jsonv2) writes some strings differently (invalid UTF-8 as a
// raw U+FFFD instead of \ufffd) and words the manifest's parse errors
// differently from MarbleRun. Build with GOEXPERIMENT=nojsonv2 (README,
// "Requirements").
var _ = build_with_GOEXPERIMENT_nojsonv2_see_README_Requirements
