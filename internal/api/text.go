// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// refuseBadText answers 400 to a request with a string no field can hold
// (checkRequestText) before its handler runs.
func refuseBadText(next ipamv1.StrictHandlerFunc, _ string) ipamv1.StrictHandlerFunc {
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, req any) (any, error) {
		if err := checkRequestText(req); err != nil {
			return nil, err
		}
		return next(ctx, w, r, req)
	}
}

// checkRequestText refuses a request any string of which, path or query
// parameter or body property at any depth (map keys included), is not
// valid UTF-8 or holds a NUL character, which no PostgreSQL text can store,
// or any other control character (C0, DEL, C1), which no name, address,
// token, time or identifier of the API has a use for. The exception is
// annotation values (freeTextFields), which Kubernetes lets hold any text:
// only NUL is refused there. The error names the field as a JSON path of
// the body or a parameter name; a bad map key names the map. It runs on
// every operation before its handler, so no such string reaches the store.
func checkRequestText(req any) error {
	f := checkText(reflect.ValueOf(req), false)
	if f == nil {
		return nil
	}
	return alloc.Invalid(f.path(), "%s", f.msg)
}

// freeTextFields are the properties whose string values (in a map: its
// values, not its keys) may hold control characters other than NUL.
var freeTextFields = map[string]bool{"annotations": true}

// textFault is a bad string checkText found: what is wrong with it, and
// the steps from the checked value down to it (innermost first), each a
// property's name or a list or map index. The path is only built for a
// refusal: every request is checked, and nearly all pass.
type textFault struct {
	msg   string
	steps []textStep
}

type textStep struct {
	name  string // a property; "" for an index
	index string // [2] or [key]
}

// path is the fault's JSON path: a.b[2].c, map entries as a[key].
func (f *textFault) path() string {
	var path string
	for i := len(f.steps) - 1; i >= 0; i-- {
		if st := f.steps[i]; st.name != "" {
			path = joinPath(path, st.name)
		} else {
			path += st.index
		}
	}
	return path
}

// textField is a field of a struct that checkText looks into.
type textField struct {
	index int
	name  string // its JSON name; "" for the untagged Params and Body of a request object
	free  bool   // freeTextFields
}

// textFields caches the fields checkText looks into of each struct type
// (reflect.Type to []textField): reading them from the tags took as long
// as checking the strings.
var textFields sync.Map

func textFieldsOf(t reflect.Type) []textField {
	if fs, ok := textFields.Load(t); ok {
		return fs.([]textField)
	}
	var fs []textField
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		fs = append(fs, textField{index: i, name: name, free: freeTextFields[name]})
	}
	textFields.Store(t, fs)
	return fs
}

func checkText(v reflect.Value, free bool) *textFault {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkText(v.Elem(), free)
	case reflect.String:
		if msg := badText(v.String(), free); msg != "" {
			return &textFault{msg: msg}
		}
	case reflect.Struct:
		for _, f := range textFieldsOf(v.Type()) {
			if fault := checkText(v.Field(f.index), f.free); fault != nil {
				if f.name != "" {
					fault.steps = append(fault.steps, textStep{name: f.name})
				}
				return fault
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if fault := checkText(v.Index(i), free); fault != nil {
				fault.steps = append(fault.steps, textStep{index: fmt.Sprintf("[%d]", i)})
				return fault
			}
		}
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
		for _, k := range keys {
			if k.Kind() == reflect.String {
				if msg := badText(k.String(), false); msg != "" {
					return &textFault{msg: "a key " + msg}
				}
			}
			if fault := checkText(v.MapIndex(k), free); fault != nil {
				fault.steps = append(fault.steps, textStep{index: fmt.Sprintf("[%v]", k)})
				return fault
			}
		}
	}
	return nil
}

// badText says what is wrong with s, or "" when nothing is: invalid UTF-8,
// a NUL, or (unless free) another control character.
func badText(s string, free bool) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 { // not an encoded U+FFFD
				return fmt.Sprintf("is not valid UTF-8 (byte %d)", i)
			}
		case r == 0:
			return fmt.Sprintf("contains a NUL character (byte %d), which no text field can hold", i)
		case !free && unicode.IsControl(r):
			return fmt.Sprintf("contains the control character %U (byte %d)", r, i)
		}
	}
	return ""
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
