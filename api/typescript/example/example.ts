// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// A program as a user of @ipam-dev/client writes it, and the usage example
// of README.md: make lint-api type-checks it (tsc --strict) in a project
// that installed the packed tarball, so it proves the tarball's exports,
// JavaScript and declarations are complete and that the README's example
// compiles.
import { createIPAMClient, ProblemError, unwrap, type Allocation, type Pool } from "@ipam-dev/client";

export async function example(baseUrl: string, token?: string): Promise<void> {
  const ipam = createIPAMClient({ baseUrl, token });

  // List the pools: unwrap gives the 2xx body, typed by the API.
  const { items } = unwrap(await ipam.GET("/v1/pools"));
  for (const pool of items) console.log(pool.name, pool.spec.ipv4?.cidrs ?? [], pool.spec.ipv6?.cidrs ?? []);

  // Lease one address per family to a Pod's interface (201; a retry 200).
  try {
    const lease: Allocation = unwrap(
      await ipam.POST("/v1/nodes/{node}/leases", {
        params: { path: { node: "worker-1" } },
        body: {
          owner: { namespace: "shop", name: "web-0", uid: "7c1d2f0e" },
          containerID: "3f2a9c71",
          interface: "eth0",
        },
      }),
    );
    for (const a of lease.addresses) console.log(a.family, a.address, "gateway", a.gateway);
  } catch (e) {
    // Any other answer is a ProblemError: type says why, field what input.
    if (!(e instanceof ProblemError)) throw e;
    if (e.type === "urn:ipam:problem:pool-exhausted") console.log(`pool exhausted; retry in ${e.retryAfter ?? "?"} s`);
    else console.log(e.status, e.title, e.detail ?? "", e.field ?? "");
  }

  // The plain openapi-fetch result is there too, for a caller that wants
  // to look at the status itself.
  const { data, error, response } = await ipam.GET("/v1/pools/{pool}", { params: { path: { pool: "default" } } });
  if (error) console.log(response.status, error.type);
  else {
    const pool: Pool = data;
    console.log(pool.name, pool.status);
  }
}
