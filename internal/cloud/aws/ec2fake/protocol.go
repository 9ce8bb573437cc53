// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// actions are the EC2 actions the fake answers, each called with the
// server's lock held and the request's form.
var actions = map[string]func(*Server, map[string][]string) (any, *APIError){
	"DescribeInstances":               (*Server).describeInstancesLocked,
	"DescribeInstanceTypes":           (*Server).describeInstanceTypesLocked,
	"DescribeSubnets":                 (*Server).describeSubnetsLocked,
	"DescribeVpcs":                    (*Server).describeVpcsLocked,
	"DescribeSecurityGroups":          (*Server).describeSecurityGroupsLocked,
	"DescribeNetworkInterfaces":       (*Server).describeNetworkInterfacesLocked,
	"CreateNetworkInterface":          (*Server).createNetworkInterfaceLocked,
	"AttachNetworkInterface":          (*Server).attachNetworkInterfaceLocked,
	"ModifyNetworkInterfaceAttribute": (*Server).modifyNetworkInterfaceLocked,
	"DetachNetworkInterface":          (*Server).detachNetworkInterfaceLocked,
	"DeleteNetworkInterface":          (*Server).deleteNetworkInterfaceLocked,
	"AssignPrivateIpAddresses":        (*Server).assignLocked,
	"UnassignPrivateIpAddresses":      (*Server).unassignLocked,
	"AssignIpv6Addresses":             (*Server).assignIPv6Locked,
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, &APIError{Status: http.StatusMethodNotAllowed, Code: "InvalidHttpRequest", Message: "EC2 takes POST"})
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, &APIError{Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	action := r.PostForm.Get("Action")
	s.mu.Lock()
	a, f := s.callLocked(action, r.PostForm)
	s.mu.Unlock()
	s.deliver(w, r, a, f)
}

// callLocked answers a call, encoded, and what fault befalls its answer.
func (s *Server) callLocked(action string, form map[string][]string) (answer, AfterFault) {
	s.calls[action]++
	if s.fault != nil {
		if e := s.fault(action); e != nil {
			s.faults[FaultRefused]++
			return encodeError(e), AfterFault{}
		}
	}
	f := s.drawLocked(action)
	if f.Kind == FaultThrottled {
		s.faults[FaultThrottled]++
		return encodeError(Throttled()), AfterFault{}
	}
	var (
		out any
		e   *APIError
	)
	if handle, ok := actions[action]; ok {
		out, e = handle(s, form)
		if !strings.HasPrefix(action, "Describe") {
			s.recordLocked()
		}
	} else {
		e = &APIError{Code: "InvalidAction", Message: fmt.Sprintf("The action %s is not valid for this web service.", action)}
	}
	// The hook decides first; FaultNone leaves the rates' draw.
	if s.after != nil {
		if h := s.after(action); h.Kind != FaultNone {
			f = h
		}
	}
	if f.Kind != FaultNone {
		s.faults[f.Kind]++
	}
	if e != nil {
		return encodeError(e), f
	}
	var b bytes.Buffer
	b.WriteString(xml.Header)
	_ = xml.NewEncoder(&b).Encode(out)
	return answer{status: http.StatusOK, body: b.Bytes()}, f
}

// xmlns is the namespace of EC2's answers.
const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

// requestID is the fake's request id in every answer.
const requestID = "7a62c49f-347e-4fc4-9331-6e8eEXAMPLE"

func writeError(w http.ResponseWriter, e *APIError) {
	encodeError(e).write(w)
}

// writeErrorBody writes e's body as EC2 writes it.
func writeErrorBody(w io.Writer, e *APIError) {
	type errorResponse struct {
		XMLName   xml.Name `xml:"Response"`
		Code      string   `xml:"Errors>Error>Code"`
		Message   string   `xml:"Errors>Error>Message"`
		RequestID string   `xml:"RequestID"`
	}
	_, _ = io.WriteString(w, xml.Header)
	_ = xml.NewEncoder(w).Encode(errorResponse{Code: e.Code, Message: e.Message, RequestID: requestID})
}

// list answers the values of a flattened list parameter name.1, name.2, ...
func list(form map[string][]string, name string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[name+"."+strconv.Itoa(i)]
		if !ok || len(v) == 0 {
			return out
		}
		out = append(out, v[0])
	}
}

// filters answers the Filter.N.Name -> values of a request.
func filters(form map[string][]string) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name, ok := form["Filter."+strconv.Itoa(i)+".Name"]
		if !ok || len(name) == 0 {
			return out
		}
		out[name[0]] = list(form, "Filter."+strconv.Itoa(i)+".Value")
	}
}

// page cuts items after the NextToken of form, answering the page and
// the token of the next one ("" at the end). A token is a cursor, the
// key of the last item answered, and the next page starts after it in
// key order: as EC2's opaque tokens, it neither skips nor repeats an
// item when items before it come or go between the pages (an offset
// did: an instance terminated between a listing's pages took the next
// page's first items out of the listing).
func page[T any](s *Server, form map[string][]string, items []T, key func(T) string) ([]T, string, *APIError) {
	items = slices.Clone(items)
	slices.SortStableFunc(items, func(a, b T) int { return strings.Compare(key(a), key(b)) })
	start := 0
	if tok := first(form, "NextToken"); tok != "" {
		after, ok := strings.CutPrefix(tok, pageTokenPrefix)
		if !ok {
			return nil, "", &APIError{Code: "InvalidPaginationToken", Message: "The pagination token is not valid."}
		}
		start, _ = slices.BinarySearchFunc(items, after, func(it T, k string) int {
			if key(it) <= k {
				return -1
			}
			return 1
		})
	}
	size := len(items) - start
	if max, err := strconv.Atoi(first(form, "MaxResults")); err == nil && max > 0 {
		size = min(size, max)
	}
	if s.pageSize > 0 {
		size = min(size, s.pageSize)
	}
	end := start + size
	if end < len(items) && end > start {
		return items[start:end], pageTokenPrefix + key(items[end-1]), nil
	}
	return items[start:end], "", nil
}

// pageTokenPrefix marks the fake's pagination tokens.
const pageTokenPrefix = "after:"

func first(form map[string][]string, key string) string {
	if v := form[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}
