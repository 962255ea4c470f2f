// Package schemacheck validates JSON documents against the subset of JSON
// Schema 2020-12 that benchd/results/schema.json uses. It is deliberately
// strict: an unknown keyword in the schema is an error, so the schema cannot
// grow a rule this checker silently ignores.
package schemacheck

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
)

// Validate checks doc against schema and returns every violation.
func Validate(schema, doc []byte) ([]string, error) {
	var root map[string]any
	if err := json.Unmarshal(schema, &root); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("document: %w", err)
	}
	js := jsonSchema{root: root}
	return js.validate(root, v, "$"), nil
}

type jsonSchema struct {
	root map[string]any
}

var knownKeywords = map[string]bool{
	"$schema": true, "$id": true, "title": true, "description": true, "$defs": true, "$ref": true,
	"type": true, "required": true, "additionalProperties": true, "properties": true, "items": true,
	"const": true, "enum": true, "pattern": true, "format": true, "minimum": true, "minLength": true,
	"minItems": true, "maxItems": true, "allOf": true, "anyOf": true, "not": true, "if": true,
	"then": true, "else": true,
}

func (js jsonSchema) validate(s map[string]any, v any, path string) []string {
	var errs []string
	fail := func(format string, a ...any) { errs = append(errs, path+": "+fmt.Sprintf(format, a...)) }
	for k := range s {
		if !knownKeywords[k] {
			fail("schema keyword %q not supported by the test validator", k)
		}
	}
	if ref, ok := s["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/$defs/")
		def, ok := js.root["$defs"].(map[string]any)[name].(map[string]any)
		if !ok {
			fail("unresolved $ref %s", ref)
			return errs
		}
		errs = append(errs, js.validate(def, v, path)...)
	}
	if t, ok := s["type"].(string); ok && !hasType(v, t) {
		fail("want %s, got %T", t, v)
		return errs
	}
	if c, ok := s["const"]; ok && v != c {
		fail("want const %v, got %v", c, v)
	}
	if e, ok := s["enum"].([]any); ok {
		found := false
		for _, x := range e {
			found = found || x == v
		}
		if !found {
			fail("%v not in enum %v", v, e)
		}
	}
	if str, ok := v.(string); ok {
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			fail("%q does not match %s", str, p)
		}
		if m, ok := s["minLength"].(float64); ok && float64(len(str)) < m {
			fail("shorter than %v", m)
		}
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
				fail("not a date-time: %v", err)
			}
		}
	}
	if n, ok := v.(float64); ok {
		if m, ok := s["minimum"].(float64); ok && n < m {
			fail("%v below minimum %v", n, m)
		}
	}
	if arr, ok := v.([]any); ok {
		if m, ok := s["minItems"].(float64); ok && float64(len(arr)) < m {
			fail("fewer than %v items", m)
		}
		if m, ok := s["maxItems"].(float64); ok && float64(len(arr)) > m {
			fail("more than %v items", m)
		}
		if it, ok := s["items"].(map[string]any); ok {
			for i, x := range arr {
				errs = append(errs, js.validate(it, x, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	}
	if obj, ok := v.(map[string]any); ok {
		if req, ok := s["required"].([]any); ok {
			for _, k := range req {
				if _, ok := obj[k.(string)]; !ok {
					fail("missing required %q", k)
				}
			}
		}
		props, _ := s["properties"].(map[string]any)
		for k, x := range obj {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, js.validate(ps, x, path+"."+k)...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					fail("unexpected property %q", k)
				}
			case map[string]any:
				errs = append(errs, js.validate(ap, x, path+"."+k)...)
			}
		}
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			errs = append(errs, js.validate(sub.(map[string]any), v, path)...)
		}
	}
	if anyOf, ok := s["anyOf"].([]any); ok {
		match := false
		for _, sub := range anyOf {
			match = match || len(js.validate(sub.(map[string]any), v, path)) == 0
		}
		if !match {
			fail("matches none of anyOf")
		}
	}
	if not, ok := s["not"].(map[string]any); ok && len(js.validate(not, v, path)) == 0 {
		fail("matches a forbidden schema")
	}
	if cond, ok := s["if"].(map[string]any); ok {
		branch := "else"
		if len(js.validate(cond, v, path)) == 0 {
			branch = "then"
		}
		if b, ok := s[branch].(map[string]any); ok {
			errs = append(errs, js.validate(b, v, path+"("+branch+")")...)
		}
	}
	return errs
}

func hasType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		n, ok := v.(float64)
		return ok && n == math.Trunc(n)
	}
	return false
}
