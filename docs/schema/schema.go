// Package schema ships the JSON Schema of the --json output (output-v3.json, draft
// 2020-12; docs/json-output.md explains it) and checks documents against it. Only tests
// import this package: the agent binary never links the validator.
package schema

import (
	"bytes"
	_ "embed"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// OutputV3 is the schema of format_version "3".
//
//go:embed output-v3.json
var OutputV3 []byte

// OutputV3Name is the schema's file name, as validation errors cite it.
const OutputV3Name = "output-v3.json"

var compiled = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(OutputV3))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", OutputV3Name, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat() // "date-time" is checked, not only annotated
	if err := c.AddResource(OutputV3Name, doc); err != nil {
		return nil, err
	}
	return c.Compile(OutputV3Name)
})

// Validate checks one --json document (the bytes a command printed) against OutputV3.
// The error lists every violation with its place in the document.
func Validate(document []byte) error {
	sch, err := compiled()
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(document))
	if err != nil {
		return fmt.Errorf("not one JSON document: %w", err)
	}
	return sch.Validate(inst)
}
