// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultLeakAge is how old a detached interface must be before the
// collector deletes it (the VPC CNI's and Cilium's five minutes): a
// younger one may be a create whose attach is still under way.
const DefaultLeakAge = 5 * time.Minute

// CollectLeaked deletes the interfaces of the cluster (those carrying
// every tag of tags) that are attached to nothing and were created at
// least minAge before now (by their TagCreatedAt), and answers the ids it
// deleted. Only interfaces the cloud shows as available are candidates:
// one still attached, or still detaching (the cloud detaches
// asynchronously), is never touched, nor one whose creation time is
// missing or unreadable (it was not made by the workers). An interface
// gone meanwhile counts as collected; other failures are joined and the
// rest still tried.
func CollectLeaked(ctx context.Context, m InterfaceManager, tags map[string]string, minAge time.Duration, now time.Time) ([]string, error) {
	if len(tags) == 0 {
		return nil, errors.New("collecting leaked interfaces needs the cluster's tags: without them every detached interface of the account matches")
	}
	detached, err := m.Detached(ctx, tags)
	if err != nil {
		return nil, err
	}
	var deleted []string
	var errs []error
	for _, f := range detached {
		if f.Attached {
			continue
		}
		created, err := time.Parse(time.RFC3339, f.Tags[TagCreatedAt])
		if err != nil || now.Sub(created) < minAge {
			continue
		}
		switch err := m.DeleteInterface(ctx, f.ID); {
		case err == nil, KindOf(err) == KindNotFound:
			deleted = append(deleted, f.ID)
		default:
			errs = append(errs, fmt.Errorf("deleting leaked interface %s: %w", f.ID, err))
		}
	}
	return deleted, errors.Join(errs...)
}
