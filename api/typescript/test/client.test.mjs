// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// What the types cannot show: the requests the client sends and how it
// reads the answers, against a fetch that answers from a table instead of
// a server. make lint-api runs it with node --test in the project that
// installed the packed tarball, so it exercises dist/ as users get it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { bearerAuth, createIPAMClient, ProblemError, unwrap } from "@ipam-dev/client";

// fakeFetch answers every request with `answer` and keeps the requests.
function fakeFetch(answer) {
  const requests = [];
  const fetch = async (request) => {
    requests.push(request);
    return answer();
  };
  return { fetch, requests };
}

const json = (status, body, type = "application/json", headers = {}) => () =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": type, ...headers } });

test("a call sends the token and returns the 2xx body", async () => {
  const f = fakeFetch(json(200, { items: [{ name: "default" }] }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test:8080", token: "ipam_secret", fetch: f.fetch });
  const list = unwrap(await ipam.GET("/v1/pools", { params: { query: { space: "blue" } } }));
  assert.deepEqual(list, { items: [{ name: "default" }] });
  assert.equal(f.requests.length, 1);
  assert.equal(f.requests[0].url, "http://ipam.test:8080/v1/pools?space=blue");
  assert.equal(f.requests[0].headers.get("Authorization"), "Bearer ipam_secret");
});

test("without a token no Authorization is sent", async () => {
  const f = fakeFetch(json(200, { items: [] }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  await ipam.GET("/v1/pools");
  assert.equal(f.requests[0].headers.has("Authorization"), false);
});

test("a call's own Authorization wins over the client's token", async () => {
  const f = fakeFetch(json(200, { items: [] }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", token: "ipam_client", fetch: f.fetch });
  await ipam.GET("/v1/pools", { headers: { Authorization: "Bearer ipam_other" } });
  assert.equal(f.requests[0].headers.get("Authorization"), "Bearer ipam_other");
});

test("an empty token is refused", () => {
  assert.throws(() => bearerAuth(""), /empty token/);
});

test("a problem answer throws ProblemError with its members", async () => {
  const problem = {
    type: "urn:ipam:problem:pool-exhausted",
    title: "Pool exhausted",
    status: 409,
    detail: "2 addresses are cooling",
    pool: "default",
  };
  const f = fakeFetch(json(409, problem, "application/problem+json", { "Retry-After": "7" }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  const result = await ipam.POST("/v1/nodes/{node}/leases", {
    params: { path: { node: "worker-1" } },
    body: { owner: { namespace: "shop", name: "web-0" }, containerID: "c1", interface: "eth0" },
  });
  assert.throws(
    () => unwrap(result),
    (e) => {
      assert.ok(e instanceof ProblemError);
      assert.equal(e.name, "ProblemError");
      assert.equal(e.type, problem.type);
      assert.equal(e.status, 409);
      assert.equal(e.detail, problem.detail);
      assert.equal(e.retryAfter, 7);
      assert.equal(e.problem.pool, "default");
      assert.equal(e.message, "409 Pool exhausted: 2 addresses are cooling");
      return true;
    },
  );
  assert.equal(f.requests[0].url, "http://ipam.test/v1/nodes/worker-1/leases");
  assert.equal(f.requests[0].method, "POST");
});

test("bad input names the field", async () => {
  const problem = { type: "urn:ipam:problem:invalid-input", title: "Invalid input", status: 400, field: "spec.ipv4.cidrs[0]" };
  const f = fakeFetch(json(400, problem, "application/problem+json"));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  const result = await ipam.POST("/v1/pools", { body: { name: "bad", spec: { ipv4: { cidrs: ["10.0.0.1/8"], maskSize: 24 } } } });
  assert.throws(() => unwrap(result), { name: "ProblemError", field: "spec.ipv4.cidrs[0]", message: /\(field spec\.ipv4\.cidrs\[0\]\)$/ });
});

test("an answer that is no problem becomes an about:blank one", async () => {
  const f = fakeFetch(() => new Response("upstream connect error", { status: 502, statusText: "Bad Gateway" }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  const result = await ipam.GET("/v1/consistency");
  assert.throws(() => unwrap(result), { type: "about:blank", title: "Bad Gateway", status: 502, detail: "upstream connect error" });
});

test("an error answer without a body still throws", async () => {
  // openapi-fetch leaves `error` undefined here; unwrap goes by the status.
  const f = fakeFetch(() => new Response(null, { status: 404, headers: { "Content-Length": "0" } }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  const result = await ipam.GET("/v1/pools/{pool}", { params: { path: { pool: "gone" } } });
  assert.equal(result.error, undefined);
  assert.throws(() => unwrap(result), { name: "ProblemError", status: 404 });
});

test("a 204 answer unwraps to undefined", async () => {
  const f = fakeFetch(() => new Response(null, { status: 204 }));
  const ipam = createIPAMClient({ baseUrl: "http://ipam.test", fetch: f.fetch });
  const result = await ipam.DELETE("/v1/nodes/{node}/attachments/{containerID}/{interface}", {
    params: { path: { node: "worker-1", containerID: "3f2a9c71", interface: "eth0" } },
  });
  assert.equal(unwrap(result), undefined);
  assert.equal(f.requests[0].method, "DELETE");
});
