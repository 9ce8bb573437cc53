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
	return checkText(reflect.ValueOf(req), "", false)
}

// freeTextFields are the properties whose string values (in a map: its
// values, not its keys) may hold control characters other than NUL.
var freeTextFields = map[string]bool{"annotations": true}

func checkText(v reflect.Value, path string, free bool) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkText(v.Elem(), path, free)
	case reflect.String:
		if msg := badText(v.String(), free); msg != "" {
			return alloc.Invalid(path, "%s", msg)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			p := path // untagged: the Params and Body of a request object
			if name != "" {
				p = joinPath(path, name)
			}
			if err := checkText(v.Field(i), p, freeTextFields[name]); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := checkText(v.Index(i), fmt.Sprintf("%s[%d]", path, i), free); err != nil {
				return err
			}
		}
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
		for _, k := range keys {
			if k.Kind() == reflect.String {
				if msg := badText(k.String(), false); msg != "" {
					return alloc.Invalid(path, "a key %s", msg)
				}
			}
			if err := checkText(v.MapIndex(k), fmt.Sprintf("%s[%v]", path, k), free); err != nil {
				return err
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
