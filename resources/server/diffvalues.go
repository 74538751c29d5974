package server

import (
	"encoding/json"
	"strconv"
)

// flagValue is a flag's recorded display ("0.85", "\"NEXTN\"", "true") as the typed value
// a diff carries: a string, a number (json.Number, exact as written) or a boolean.
func flagValue(display string) any {
	if s, err := strconv.Unquote(display); err == nil {
		return s
	}
	if b, err := strconv.ParseBool(display); err == nil && (display == "true" || display == "false") {
		return b
	}
	if json.Valid([]byte(display)) {
		var n json.Number
		if json.Unmarshal([]byte(display), &n) == nil {
			return n
		}
	}
	return display
}
