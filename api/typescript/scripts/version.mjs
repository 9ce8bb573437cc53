// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// version.mjs gives the package the version of the API it was generated
// from (info.version of api/openapi.yaml), in package.json and
// package-lock.json, so that `make check-generated` sees a spec version
// bump that was not carried over, as it sees a stale src/schema.ts.
//
//   node scripts/version.mjs ../openapi.yaml
//
// It reads the one scalar it needs with a pattern rather than a YAML
// library: the package has no YAML parser of its own (openapi-typescript's
// is an implementation detail), and info.version is a plain top-level key.
import { readFileSync, writeFileSync } from "node:fs";

const specPath = process.argv[2];
if (!specPath) {
  console.error("usage: node scripts/version.mjs OPENAPI.yaml");
  process.exit(2);
}
const spec = readFileSync(specPath, "utf8");
const info = spec.match(/^info:\n((?:(?: .*)?\n)*)/m);
const m = info?.[1].match(/^  version:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$/m);
if (!m) throw new Error(`${specPath}: no info.version`);
const version = m[1];
// npm refuses a version that is not semver; say so here rather than at npm pack.
if (!/^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$/.test(version)) {
  throw new Error(`${specPath}: info.version ${version} is not a semver version npm accepts`);
}

// Rewrite only on a change, in npm's own layout (two spaces, final
// newline), so that an unchanged version leaves both files untouched.
function setVersion(path, objects) {
  const doc = JSON.parse(readFileSync(path, "utf8"));
  let changed = false;
  for (const o of objects(doc)) {
    if (o.version !== version) {
      o.version = version;
      changed = true;
    }
  }
  if (changed) {
    writeFileSync(path, JSON.stringify(doc, null, 2) + "\n");
    console.log(`${path}: version ${version}`);
  }
}
setVersion("package.json", (d) => [d]);
setVersion("package-lock.json", (d) => [d, d.packages[""]]);
