package client

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"testing"
)

// TestGeneratedNamesAreGoSpelled: every name types.gen.go declares, types
// and struct fields alike, spells its initialisms as Go does (ID, URL), so a
// caller writes charge.ID and AccountID as with the standard library and
// stripe-go. It reads the file, so a change of oapi-codegen.yaml or of the
// generator that brings Id back fails here.
func TestGeneratedNamesAreGoSpelled(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "types.gen.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	// A lowercase run after the initialism's capital: Id, Url, Http, Json,
	// at the end of the name or before the next word (AccountIdPath).
	unGo := regexp.MustCompile(`(Id|Url|Uri|Http|Https|Json|Api|Sql)([A-Z0-9]|$)`)
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.TypeSpec:
			names = append(names, n.Name.Name)
		case *ast.Field:
			for _, id := range n.Names {
				names = append(names, id.Name)
			}
		}
		return true
	})
	if len(names) < 100 {
		t.Fatalf("found %d names in types.gen.go, want the whole API's", len(names))
	}
	for _, name := range names {
		if unGo.MatchString(name) {
			t.Errorf("types.gen.go declares %s: want Go's initialisms (ID, URL, ...)", name)
		}
	}
}

// The former names of generated types still name the same types
// (compat.go), so code that wrote client.ChargeId or client.TooManyUnknownKeys
// builds unchanged.
var (
	_ AccountId          = AccountID("")
	_ ChargeId           = ChargeID("")
	_ EventId            = EventID("")
	_ RequestId          = RequestID("")
	_ WebhookEndpointId  = WebhookEndpointID("")
	_                    = map[ChargeId]bool{ChargeID("ch_1"): true}
	_ TooManyUnknownKeys = TooManyRequests{}
)
