package payments

import (
	"regexp"
	"testing"
)

// The published description is for the service's users: no reference to
// this project's issue tracker belongs in it.
func TestOpenAPIHasNoTrackerReferences(t *testing.T) {
	tracker := regexp.MustCompile(`(?i)\bissues? #?[0-9]+|\b(TODO|FIXME|XXX)\b`)
	for i, m := range tracker.FindAllIndex(OpenAPI, -1) {
		line := 1 + len(regexp.MustCompile("\n").FindAllIndex(OpenAPI[:m[0]], -1))
		t.Errorf("openapi.yaml line %d carries %q: the published description names no tracker item", line, OpenAPI[m[0]:m[1]])
		if i == 9 {
			break
		}
	}
}
