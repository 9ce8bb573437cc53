// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"net/http"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// page fetches one page: the token of the page (nil for the first) and the
// page size in, the items and the next token (nil on the last page) out.
type page[T any] func(cont *string, limit int) (items []T, next *string, err error)

// allPages follows the `continue` tokens of a list to its end, showing how
// far it got on a terminal: the API pages every list, and a table or a
// JSON document of part of a list would mislead.
func allPages[T any](a *app, what string, fetch page[T]) ([]T, error) {
	p := a.progress()
	defer p.done()
	var all []T
	var cont *string
	for pages := 1; ; pages++ {
		items, next, err := fetch(cont, a.conn.pageSize)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == nil || *next == "" {
			return all, nil
		}
		p.set("%s: %s so far, fetching page %d…", what, num(int64(len(all))), pages+1)
		cont = next
	}
}

// answer turns a generated client's answer into an error: the service's
// problem (title, detail and field) for a status that is no success, or a
// 2xx without the JSON the contract promises (decoded false).
func answer(res *http.Response, body []byte, decoded bool) error {
	if err := ipamclient.Check(res, body); err != nil {
		return err
	}
	if !decoded {
		return errors.New("the service answered " + res.Status + " without the expected JSON body")
	}
	return nil
}
