// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"net/http"
	"strconv"
	"time"
)

// retryAfter is how long an ARM answer asks the caller to wait, from the
// headers azcore's retry policy reads (Retry-After-Ms,
// x-ms-retry-after-ms, Retry-After in seconds or as a date); 0 when it
// says nothing. The SDK gives up at once on a Retry-After beyond its
// MaxRetryDelay (60 s by default): the workers then hold the node that
// long themselves, across passes.
func retryAfter(resp *http.Response) time.Duration {
	if resp == nil {
		return 0
	}
	for _, h := range []struct {
		name string
		unit time.Duration
	}{{"Retry-After-Ms", time.Millisecond}, {"x-ms-retry-after-ms", time.Millisecond}, {"Retry-After", time.Second}} {
		v := resp.Header.Get(h.name)
		if v == "" {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			return time.Duration(n) * h.unit
		}
		if h.unit == time.Second {
			if at, err := http.ParseTime(v); err == nil {
				return max(time.Until(at), 0)
			}
		}
	}
	return 0
}
