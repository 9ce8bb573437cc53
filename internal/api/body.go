// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	k8sjson "sigs.k8s.io/json"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// Request bodies are decoded strictly, as the Kubernetes API server decodes
// objects: a property the schema does not have, a property given twice, a
// property in another letter case than the schema's and a null are each a
// 400 that names the property. The generated handler's encoding/json
// decoder would ignore the first, keep the last of the second, match the
// third case-insensitively ({"expire":true,"Expire":false} leased with
// expire false) and read the fourth as "absent", so a client's typo or a
// confused client would be served something it did not ask for. No
// property of api/openapi.yaml is nullable (TestSpecHasNoNullable), so a
// null is never a valid value.

// bodyTypes maps each operation that takes a JSON body to its body's Go
// type, read from the generated strict server interface: the method named
// after the operation takes a request object whose Body field points to it.
var bodyTypes = func() map[string]reflect.Type {
	iface := reflect.TypeFor[ipamv1.StrictServerInterface]()
	m := make(map[string]reflect.Type)
	for id := range operations {
		meth, ok := iface.MethodByName(strings.ToUpper(id[:1]) + id[1:])
		if !ok || meth.Type.NumIn() != 2 {
			continue
		}
		req := meth.Type.In(1)
		if req.Kind() != reflect.Struct {
			continue
		}
		if f, ok := req.FieldByName("Body"); ok && f.Type.Kind() == reflect.Pointer {
			m[id] = f.Type.Elem()
		}
	}
	return m
}()

// checkBody reads a request body once, whole, within timeout (see
// readBody), and refuses it before any handler decodes it when it is not
// UTF-8 (PostgreSQL text cannot hold it, and encoding/json would turn it
// into U+FFFD silently), or, for a POST or PUT (whose body requireJSON has
// made JSON), when it is not exactly one JSON value (oneJSONValue) or, for
// an operation with a JSON body, when it has an unknown, duplicate or
// differently cased property, or a null. It runs after routing and
// requireJSON, and before admission (admitter.middleware): a request
// waits for a slot with its body in memory, so a slow body holds no slot,
// and a client that gives up while it waits is noticed at once (net/http
// watches the connection only once the body is read). The handler reads
// the same bytes.
func checkBody(ps problems, timeout time.Duration) ipamv1.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
				next.ServeHTTP(w, r)
				return
			}
			data, err := readBody(w, r, timeout)
			if err != nil {
				ps.write(w, r, bodyError(err))
				return
			}
			if !utf8.Valid(data) {
				ps.write(w, r, alloc.Invalid("body", "is not valid UTF-8 (byte %d)", invalidUTF8At(data)))
				return
			}
			if r.Method == http.MethodPost || r.Method == http.MethodPut {
				if err := oneJSONValue(data); err != nil {
					ps.write(w, r, err)
					return
				}
				id := operationsByRoute[r.Method+" "+chi.RouteContext(r.Context()).RoutePattern()]
				if t, ok := bodyTypes[id]; ok {
					if err := checkStrictJSON(data, t); err != nil {
						ps.write(w, r, err)
						return
					}
				}
			}
			r.Body = io.NopCloser(bytes.NewReader(data))
			next.ServeHTTP(w, r)
		})
	}
}

// readBody reads r's body whole (the edge bounds its size), within timeout
// when it is positive. The deadline is the connection's, set through w;
// afterwards the connection has none until net/http sets its own for the
// next request, since net/http watches it during the handler for the
// client going away, and a deadline passing then would end the request's
// context. A writer without deadlines (a test recorder) reads without one.
func readBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) ([]byte, error) {
	if timeout > 0 {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
			defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
		}
	}
	return io.ReadAll(r.Body)
}

// oneJSONValue refuses data that is not exactly one JSON value with only
// whitespace around it, naming "body". The generated decoder reads the
// first value and ignores the rest, and checkStrictJSON can only check
// data that is JSON: without this, one byte after the value would let the
// generated decoder read it leniently (an unknown property ignored, the
// last of a duplicate taken, a property matched in another letter case).
func oneJSONValue(data []byte) error {
	if json.Valid(data) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		return bodyError(err) // malformed, cut short or empty
	}
	at := int(dec.InputOffset())
	for at < len(data) && isJSONSpace(data[at]) {
		at++
	}
	return alloc.Invalid("body", "must be one JSON value; more data follows it at byte %d", at)
}

// isJSONSpace reports whether b is whitespace between JSON tokens.
func isJSONSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// invalidUTF8At answers the offset of the first byte of b that is not
// valid UTF-8, or -1.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// checkStrictJSON answers the first null, unknown or duplicate property of
// data, decoded as a t, as an invalid-input error naming its JSON path; nil
// when there is none or when data is not valid JSON of t's shape (the
// generated decoder reports that). data must be one JSON value
// (oneJSONValue): anything else passes unchecked.
func checkStrictJSON(data []byte, t reflect.Type) error {
	// A null is the bytes "null" (no escape spells a token): most bodies
	// have none, and tokenizing them all would cost more than the rest of
	// the check.
	if bytes.Contains(data, []byte("null")) {
		if path, ok := firstNull(data); ok {
			if path == "" {
				return alloc.Invalid("body", "must be a JSON object, not null")
			}
			return alloc.Invalid(path, "must not be null (leave the property out instead)")
		}
	}
	strict, err := k8sjson.UnmarshalStrict(data, reflect.New(t).Interface())
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		// encoding/json names the field without the indices of the lists
		// it is in (ports.port); the path at the error's offset has them.
		if path := pathAt(data, typeErr.Offset); path != "" && stripIndices(path) == typeErr.Field {
			typeErr.Field = path
		}
		return bodyError(typeErr)
	}
	if err != nil || len(strict) == 0 {
		return nil
	}
	var fe k8sjson.FieldError
	if !errors.As(strict[0], &fe) {
		return alloc.Invalid("body", "%s", strict[0].Error())
	}
	path := fe.FieldPath()
	if path == "" || strings.HasSuffix(path, ".") {
		// An empty property name ({"": 1}) leaves no name to report: the
		// problem names the object that holds it instead.
		return alloc.Invalid(cmp.Or(strings.TrimSuffix(path, "."), "body"), "has a property with an empty name, which no request has")
	}
	if strings.HasPrefix(strict[0].Error(), "duplicate field") {
		return alloc.Invalid(path, "is given more than once")
	}
	if hint := caseHint(t, path); hint != "" {
		return alloc.Invalid(path, "is not a property; property names are case-sensitive: did you mean %q?", hint)
	}
	return alloc.Invalid(path, "is not a property of this request")
}

// firstNull finds the first null in data and its JSON path (a.b[2].c);
// ok is false when there is none, or when data is not valid JSON.
func firstNull(data []byte) (path string, ok bool) {
	walkJSON(data, func(tok json.Token, p string, _ int64) bool {
		if tok == nil {
			path, ok = p, true
			return true
		}
		return false
	})
	return path, ok
}

// pathAt is the JSON path (a.b[2].c) of the value of data that ends at
// offset or, failing that, the first one ending after it; "" when data has
// none.
func pathAt(data []byte, offset int64) string {
	var path string
	walkJSON(data, func(_ json.Token, p string, end int64) bool {
		if end >= offset {
			path = p
			return true
		}
		return false
	})
	return path
}

// walkJSON calls visit with every value token of data (scalars, and the
// opening delimiter of objects and arrays), its JSON path and the offset
// where it ends, until visit answers true or data ends or is not JSON.
func walkJSON(data []byte, visit func(tok json.Token, path string, end int64) bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object bool   // an object, else an array
		key    string // the current key of an object
		index  int    // the next index of an array
		expect bool   // an object expects a key next
	}
	var stack []frame
	pathOf := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				b.WriteString("[" + strconv.Itoa(f.index-1) + "]")
			}
		}
		return b.String()
	}
	// value is called for every value token, after which the enclosing
	// object expects a key again.
	value := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].expect = true
		}
	}
	for {
		// Advance an array's index before reading its element.
		if n := len(stack); n > 0 && !stack[n-1].object && dec.More() {
			stack[n-1].index++
		}
		tok, err := dec.Token()
		if err != nil {
			return
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].expect {
			if k, isKey := tok.(string); isKey {
				stack[n-1].key = k
				stack[n-1].expect = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if visit(tok, pathOf(), dec.InputOffset()) {
				return
			}
			stack = append(stack, frame{object: tok == json.Delim('{'), expect: tok == json.Delim('{')})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			value()
		default:
			if visit(tok, pathOf(), dec.InputOffset()) {
				return
			}
			value()
		}
	}
}

// stripIndices drops the list indices of a JSON path: a[2].b is a.b.
func stripIndices(path string) string {
	var b strings.Builder
	skip := false
	for _, r := range path {
		switch {
		case r == '[':
			skip = true
		case r == ']':
			skip = false
		case !skip:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// caseHint is the property of t at path's parent that equals path's last
// name but for letter case, or "".
func caseHint(t reflect.Type, path string) string {
	names := strings.Split(path, ".")
	for _, n := range names[:len(names)-1] {
		if i := strings.IndexByte(n, '['); i >= 0 {
			n = n[:i]
		}
		f, ok := jsonField(t, n)
		if !ok {
			return ""
		}
		t = f
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			t = t.Elem()
		}
	}
	if t.Kind() != reflect.Struct {
		return ""
	}
	last := names[len(names)-1]
	for i := range t.NumField() {
		name := jsonName(t.Field(i))
		if name != last && strings.EqualFold(name, last) && name != "" && !unicode.IsSpace(rune(name[0])) {
			return name
		}
	}
	return ""
}

// jsonField is the type of t's field whose JSON name is name.
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for i := range t.NumField() {
		if jsonName(t.Field(i)) == name {
			return t.Field(i).Type, true
		}
	}
	return nil, false
}

// jsonName is the name encoding/json gives a struct field.
func jsonName(f reflect.StructField) string {
	tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if tag == "-" {
		return ""
	}
	if tag == "" {
		return f.Name
	}
	return tag
}

// requireJSON refuses (415) a POST or PUT whose body is not
// application/json. It runs after routing, so an unknown route is a 404
// whatever its body.
func requireJSON(ps problems) ipamv1.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if (r.Method == http.MethodPost || r.Method == http.MethodPut) && r.ContentLength != 0 {
				if ct := r.Header.Get("Content-Type"); ct != "application/json" && !isJSON(ct) {
					w.Header().Set("Accept", "application/json")
					ps.write(w, r, &alloc.Error{Kind: kindUnsupportedMediaType, Field: "Content-Type",
						Detail: fmt.Sprintf("the body must be application/json, not %q", ct)})
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// isJSON reports whether a Content-Type is application/json with any
// parameters (such as charset=utf-8), in any letter case.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}
