// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

func spaceToAPI(s alloc.Space) ipamv1.Space {
	return ipamv1.Space{Name: s.Name, CreatedAt: s.CreatedAt.UTC()}
}

func spaceListToAPI(items []alloc.Space, next string) ipamv1.SpaceList {
	l := ipamv1.SpaceList{Items: make([]ipamv1.Space, len(items)), Continue: optString(next)}
	for i, s := range items {
		l.Items[i] = spaceToAPI(s)
	}
	return l
}
