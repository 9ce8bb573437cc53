// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// problemContentType is the media type of every error body (RFC 9457).
const problemContentType = "application/problem+json"

// problemTypePrefix starts every problem type URI; the kind follows, e.g.
// urn:ipam:problem:pool-exhausted. The URIs are part of the API contract.
const problemTypePrefix = "urn:ipam:problem:"

// Kinds that only the HTTP layer raises, next to the domain's alloc.Kind*
// constants; together they are the problem types of the API.
const (
	kindUnauthenticated      alloc.Kind = "unauthenticated"
	kindForbidden            alloc.Kind = alloc.KindForbidden // the domain raises it too
	kindRateLimited          alloc.Kind = "rate-limited"
	kindMethodNotAllowed     alloc.Kind = "method-not-allowed"
	kindPayloadTooLarge      alloc.Kind = "payload-too-large"
	kindHeaderTooLarge       alloc.Kind = "header-too-large"
	kindUnsupportedMediaType alloc.Kind = "unsupported-media-type"
	kindUnavailable          alloc.Kind = "unavailable"
	kindInternal             alloc.Kind = "internal"
	// kindRequestTimeout: the request body did not arrive within the
	// server's read timeout (a slow or stalled client).
	kindRequestTimeout alloc.Kind = "request-timeout"
	// kindClientClosed: the client went away (timed out, canceled)
	// before the answer; nobody reads it, but the request metric counts
	// it under this status (nginx's 499), not as a server error.
	kindClientClosed alloc.Kind = "client-closed-request"
)

// statusClientClosedRequest is nginx's status for a request whose client
// closed the connection before the answer.
const statusClientClosedRequest = 499

// problemClass is the status and title of one problem type.
type problemClass struct {
	status int
	title  string
}

// problemClasses maps every kind to its HTTP status: the one table of the
// API's error semantics. An *alloc.Error whose Kind is missing here is a
// programming error and answered as internal.
var problemClasses = map[alloc.Kind]problemClass{
	alloc.KindInvalid:        {http.StatusBadRequest, "Invalid input"},
	alloc.KindNotFound:       {http.StatusNotFound, "Not found"},
	alloc.KindConflict:       {http.StatusConflict, "Already exists"},
	alloc.KindOverlap:        {http.StatusConflict, "CIDR overlap"},
	alloc.KindImmutable:      {http.StatusConflict, "Immutable field"},
	alloc.KindInUse:          {http.StatusConflict, "In use"},
	alloc.KindLeaseConflict:  {http.StatusConflict, "Lease conflict"},
	alloc.KindPoolExhausted:  {http.StatusConflict, "Pool exhausted"},
	alloc.KindPoolMatch:      {http.StatusConflict, "No single pool matches"},
	kindUnauthenticated:      {http.StatusUnauthorized, "Unauthenticated"},
	kindForbidden:            {http.StatusForbidden, "Forbidden"},
	kindRateLimited:          {http.StatusTooManyRequests, "Too many requests"},
	kindMethodNotAllowed:     {http.StatusMethodNotAllowed, "Method not allowed"},
	kindPayloadTooLarge:      {http.StatusRequestEntityTooLarge, "Payload too large"},
	kindHeaderTooLarge:       {http.StatusRequestHeaderFieldsTooLarge, "Request headers too large"},
	kindUnsupportedMediaType: {http.StatusUnsupportedMediaType, "Unsupported media type"},
	kindUnavailable:          {http.StatusServiceUnavailable, "Unavailable"},
	kindInternal:             {http.StatusInternalServerError, "Internal error"},
	kindRequestTimeout:       {http.StatusRequestTimeout, "Request timeout"},
	kindClientClosed:         {statusClientClosedRequest, "Client closed request"},

	// Fencing and sticky addresses.
	alloc.KindStaleGeneration:   {http.StatusConflict, "Stale lease generation"},
	alloc.KindStickyUnavailable: {http.StatusConflict, "Sticky address unavailable"},

	// Trust boundaries.
	alloc.KindNodeBlockLimit: {http.StatusConflict, "Node block limit reached"},
}

// unavailableError says the service cannot serve now because something it
// depends on cannot be reached: the database (unreachable, restarting, or
// its schema behind), or Kubernetes for a Pod lookup. The cause is logged,
// not sent.
type unavailableError struct {
	err error
	// dependency names what is unavailable, as the client reads it; ""
	// is the database.
	dependency string
}

func (e *unavailableError) Error() string { return "unavailable: " + e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// what is the dependency's name for the problem's detail and the log.
func (e *unavailableError) what() string {
	if e.dependency == "" {
		return "the database"
	}
	return e.dependency
}

// sqlStateError is a database error with its SQLSTATE (pgconn.PgError),
// seen without importing the driver.
type sqlStateError interface{ SQLState() string }

// unstorableStates are the SQLSTATEs of a value the database refuses to
// hold: 22021 character_not_in_repertoire (NUL, invalid UTF-8), 22P05
// untranslatable_character (\u0000 in jsonb), 22003
// numeric_value_out_of_range. The edge checks every string and integer
// first (checkRequestText, the parsers), so these mean a check is missing:
// they are answered 400, as the input's fault, and logged (problems.write).
var unstorableStates = map[string]bool{"22021": true, "22P05": true, "22003": true}

// isUnstorable reports whether err is the database refusing a value it
// cannot hold (unstorableStates), and nothing else: not a domain error
// that wraps one, and not a failed connection, whose SQLSTATE (class 08,
// 57P01 when the server shuts down) says nothing about the input.
func isUnstorable(err error) bool {
	var se sqlStateError
	return errors.As(err, &se) && unstorableStates[se.SQLState()] &&
		!errors.As(err, new(*alloc.Error)) && !errors.As(err, new(*unavailableError))
}

// problems writes every error response of the API.
type problems struct {
	log           *slog.Logger
	isUnavailable func(error) bool // see Options.IsUnavailable
}

// problemOf classifies err. ok is false for an error the client must not
// see (anything but *alloc.Error of a known kind): the answer is then the
// generic internal problem.
func problemOf(err error) (p ipamv1.Problem, ok bool) {
	kind := kindInternal
	var detail, field, pool string
	var family alloc.Family
	var nodes []string
	var ae *alloc.Error
	var ue *unavailableError
	switch {
	case errors.As(err, &ue):
		kind, detail = kindUnavailable, ue.what()+" is unavailable; retry later"
		ok = true
	case errors.As(err, &ae):
		if _, known := problemClasses[ae.Kind]; known {
			kind, detail, field, pool, family, nodes = ae.Kind, ae.Detail, ae.Field, ae.Pool, ae.Family, ae.Nodes
			ok = true
		}
	case isUnstorable(err):
		kind, detail, ok = alloc.KindInvalid, "a value the database cannot store: text with a NUL or an invalid character, or a number out of range", true
	}
	if !ok {
		detail = "internal error"
	}
	c := problemClasses[kind]
	var nodeList *[]string
	if len(nodes) > 0 {
		nodeList = &nodes
	}
	return ipamv1.Problem{
		Nodes:  nodeList,
		Type:   problemTypePrefix + string(kind),
		Title:  c.title,
		Status: c.status,
		Detail: optString(detail),
		Field:  optString(field),
		Pool:   optString(pool),
		Family: problemFamily(family),
	}, ok
}

// write answers err as a problem, and logs what the operator must hear of
// it under a class that says what it is (the attribute class):
//   - internal (error): an error the client cannot see, a bug;
//   - unavailable (warn): a dependency could not be reached (the database
//     restarting or failing over, Kubernetes), which retries outlive;
//   - validation-gap (warn): the database refused a value the edge let
//     through (isUnstorable), so a check is missing;
//   - client-gone (debug): the client went away first; it is answered 499
//     (nobody reads it; the request metric counts it so).
//
// A body cut by the server's read timeout is a 408 on a connection that
// then closes; like every other 4xx it is the client's, and not logged.
func (ps problems) write(w http.ResponseWriter, r *http.Request, err error) {
	var ae *alloc.Error
	// An error already classified (a Kubernetes lookup's) keeps its
	// dependency, though a failed dial inside it looks like the database's.
	if ps.isUnavailable != nil && !errors.As(err, &ae) && !errors.As(err, new(*unavailableError)) && r.Context().Err() == nil && ps.isUnavailable(err) {
		err = &unavailableError{err: err}
	}
	if errors.As(err, &ae) && ae.OperatorDetail != "" && mayReadEveryNode(r.Context()) {
		full := *ae
		full.Detail = full.OperatorDetail
		err = &full
	}
	p, ok := problemOf(err)
	var ue *unavailableError
	if (!ok || errors.As(err, &ue)) && ps.clientGone(r, err) {
		ps.log.LogAttrs(r.Context(), slog.LevelDebug, "api: client closed request", slog.String("class", logClassClientGone),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		p, _ = problemOf(&alloc.Error{Kind: kindClientClosed, Detail: "the client closed the request before its answer"})
		writeProblem(w, p)
		return
	}
	if ok && errors.As(err, &ae) && ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", retryAfter(ae.RetryAfter))
	}
	// Availability first: a failed connection may carry a SQLSTATE too.
	switch {
	case !ok:
		ps.log.LogAttrs(r.Context(), slog.LevelError, "api: internal error", slog.String("class", logClassInternal),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	case errors.As(err, &ue):
		ps.log.LogAttrs(r.Context(), slog.LevelWarn, "api: unavailable", slog.String("class", logClassUnavailable), slog.String("dependency", ue.what()),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	case isUnstorable(err):
		ps.log.LogAttrs(r.Context(), slog.LevelWarn, "api: the database refused a value the edge let through", slog.String("class", logClassValidationGap),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	case p.Status == http.StatusRequestTimeout:
		// The connection's read deadline has passed: answer within a
		// deadline of our own, and close it (the rest of the body may
		// still come).
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(requestTimeoutWrite))
		w.Header().Set("Connection", "close")
	}
	writeProblem(w, p)
}

// The classes of the API's log lines about failed requests (write).
const (
	logClassInternal      = "internal"
	logClassUnavailable   = "unavailable"
	logClassValidationGap = "validation-gap"
	logClassClientGone    = "client-gone"
)

// requestTimeoutWrite bounds the writing of a 408.
const requestTimeoutWrite = 5 * time.Second

// clientGone reports whether err, which the client must not see (or an
// unavailable database), comes from the client going away: its request's context has ended and err is
// that context's error, or the database connection it cut (the store's
// driver closes a connection whose statement's context ends).
func (ps problems) clientGone(r *http.Request, err error) bool {
	if r.Context().Err() == nil {
		return false
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		(ps.isUnavailable != nil && ps.isUnavailable(err))
}

// writeProblem sends p with its status and the problem media type.
func writeProblem(w http.ResponseWriter, p ipamv1.Problem) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem of strings and ints always marshals
		panic(err)
	}
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("X-Content-Type-Options", "nosniff")
	if p.Status == http.StatusServiceUnavailable && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// retryAfter is d as a Retry-After value: whole seconds, rounded up, at
// least 1.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// requestError answers a request body that could not be decoded; the
// generated strict handler calls it before any handler runs.
func (ps problems) requestError(w http.ResponseWriter, r *http.Request, err error) {
	ps.write(w, r, bodyError(err))
}

// bodyError classifies a JSON decoding error of the request body: a value
// of the wrong type names its JSON path, malformed or missing JSON names
// "body", a body over the limit is payload-too-large, a body cut by the
// server's read timeout is request-timeout, a connection that failed under
// it is client-closed-request. Anything else (a bug) stays internal.
func bodyError(err error) error {
	var (
		tooLarge *http.MaxBytesError
		typeErr  *json.UnmarshalTypeError
		syntax   *json.SyntaxError
		timeErr  *time.ParseError
		netErr   net.Error
	)
	switch {
	case errors.As(err, &tooLarge):
		return &alloc.Error{Kind: kindPayloadTooLarge, Field: "body",
			Detail: fmt.Sprintf("the request body exceeds %d bytes", tooLarge.Limit)}
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		return alloc.Invalid(field, "must be %s, not a JSON %s", jsonTypeName(typeErr.Type), typeErr.Value)
	case errors.As(err, &syntax):
		return alloc.Invalid("body", "malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.As(err, &netErr) && netErr.Timeout():
		return &alloc.Error{Kind: kindRequestTimeout, Field: "body",
			Detail: "the request body did not arrive within the server's read timeout"}
	case errors.As(err, &netErr):
		// The connection failed under the body (reset, closed): the
		// client is gone, the database is not at fault.
		return &alloc.Error{Kind: kindClientClosed, Detail: "the connection failed while the client sent the body"}
	case errors.As(err, &timeErr):
		// A date-time field's own decoder says not which field it is.
		return alloc.Invalid("body", "a date-time is not RFC 3339: %q", timeErr.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return alloc.Invalid("body", "the JSON body ends early")
	case errors.Is(err, io.EOF):
		return alloc.Invalid("body", "a JSON body is required")
	}
	return err
}

// jsonTypeName names the JSON type a Go type decodes from.
func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return "another type"
}

// paramError answers a path, query, header or cookie parameter that could
// not be bound; the generated chi wrapper calls it before the handler.
func (ps problems) paramError(w http.ResponseWriter, r *http.Request, err error) {
	ps.write(w, r, paramErrorOf(err))
}

// paramTypes names the type of the parameters that are not strings.
var paramTypes = map[string]string{
	"limit":        "an integer",
	"generation":   "an integer",
	"maskSize":     "an integer",
	"force":        "true or false",
	"allowFirstIP": "true or false",
	"allowLastIP":  "true or false",
	"router":       "true or false",
	"health":       "true or false",
	"ingress":      "true or false",
}

// paramErrorOf names the parameter at fault in an invalid-input error. The
// binder's own message is not sent: it may quote Go types.
func paramErrorOf(err error) error {
	var (
		format   *ipamv1.InvalidParamFormatError
		required *ipamv1.RequiredParamError
		header   *ipamv1.RequiredHeaderError
		cookie   *ipamv1.UnescapedCookieParamError
		tooMany  *ipamv1.TooManyValuesForParamError
		unmarsh  *ipamv1.UnmarshalingParamError
	)
	switch {
	case errors.As(err, &format):
		if t, ok := paramTypes[format.ParamName]; ok {
			return alloc.Invalid(format.ParamName, "must be %s", t)
		}
		return alloc.Invalid(format.ParamName, "has an invalid value")
	case errors.As(err, &required):
		return alloc.Invalid(required.ParamName, "is required")
	case errors.As(err, &header):
		return alloc.Invalid(header.ParamName, "header is required")
	case errors.As(err, &cookie):
		return alloc.Invalid(cookie.ParamName, "cookie is not properly escaped")
	case errors.As(err, &tooMany):
		return alloc.Invalid(tooMany.ParamName, "must be given once, not %d times", tooMany.Count)
	case errors.As(err, &unmarsh):
		return alloc.Invalid(unmarsh.ParamName, "is not valid JSON")
	}
	return err
}
