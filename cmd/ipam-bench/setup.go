// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// createSpace creates an address space.
func createSpace(ctx context.Context, c *ipamclient.ClientWithResponses, space string) error {
	resp, err := c.CreateSpaceWithResponse(ctx, ipamclient.SpaceRequest{Name: space})
	if err != nil {
		return fmt.Errorf("create space: %w", err)
	}
	return statusError("create space "+space, resp.StatusCode(), resp.Body)
}

// setupPool creates (in a fresh space, when space is set) the pool
// "default" over 10.0.0.0/8 with node blocks of mask bits, and registers the
// nodes. The caller is an administrator: nodes may only use their own
// routes.
// benchMaxBlocksPerNode lifts the pool's per-node block limit out of the
// measurement's way.
var benchMaxBlocksPerNode = 1 << 20

func setupPool(ctx context.Context, c *ipamclient.ClientWithResponses, space *string, mask int, nodes []string) error {
	if space != nil {
		if err := createSpace(ctx, c, *space); err != nil {
			return err
		}
	}
	pool, err := c.CreatePoolWithResponse(ctx, &ipamclient.CreatePoolParams{Space: space}, ipamclient.PoolRequest{
		Name: "default",
		// The hot-node phase runs every client on one node: with the 30 s
		// cooldown it holds thousands of cooling addresses, far past the
		// default per-node limit (1,024 addresses' worth of blocks), which
		// guards a real cluster's pools against one node certificate.
		Spec: ipamclient.PoolSpec{Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{"10.0.0.0/8"}, MaskSize: mask},
			MaxBlocksPerNode: &benchMaxBlocksPerNode},
	})
	if err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	if err := statusError("create pool default", pool.StatusCode(), pool.Body); err != nil {
		return err
	}
	for _, n := range nodes {
		resp, err := c.PutNodeWithResponse(ctx, n, &ipamclient.PutNodeParams{Space: space}, ipamclient.NodeSpec{})
		if err != nil {
			return fmt.Errorf("register node: %w", err)
		}
		if err := statusError("register node "+n, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	return nil
}

// teardown deletes the nodes, the pools and the space setupPool (or
// createFillPool) made in a space of its own.
func teardown(ctx context.Context, c *ipamclient.ClientWithResponses, space string, nodes, pools []string) error {
	force := true
	for _, n := range nodes {
		resp, err := c.DeleteNodeWithResponse(ctx, n, &ipamclient.DeleteNodeParams{Space: &space, Force: &force})
		if err != nil {
			return fmt.Errorf("delete node: %w", err)
		}
		if err := statusError("delete node "+n, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	for _, p := range pools {
		resp, err := c.DeletePoolWithResponse(ctx, p, &ipamclient.DeletePoolParams{Space: &space})
		if err != nil {
			return fmt.Errorf("delete pool: %w", err)
		}
		if err := statusError("delete pool "+p, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	resp, err := c.DeleteSpaceWithResponse(ctx, space)
	if err != nil {
		return fmt.Errorf("delete space: %w", err)
	}
	return statusError("delete space "+space, resp.StatusCode(), resp.Body)
}
