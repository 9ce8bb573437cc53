// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

// WriteOption changes how a write of the store runs.
type WriteOption func(*WriteOptions)

// WriteOptions are what WriteOptions set.
type WriteOptions struct {
	// DryRun: check everything and answer what the write would do, then
	// write nothing. Refusals are those of the real write.
	DryRun bool
	// Origin is who writes (AsOrigin): the database (the REST API)
	// unless set.
	Origin Origin
}

// DryRun sets WriteOptions.DryRun.
func DryRun(on bool) WriteOption { return func(o *WriteOptions) { o.DryRun = on } }

// ApplyWriteOptions folds opts into WriteOptions.
func ApplyWriteOptions(opts []WriteOption) WriteOptions {
	var o WriteOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
