// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// tour.mjs turns the README's curl tour (the ```sh tour block) into
// TypeScript calls of a client generated from api/openapi.yaml by
// openapi-typescript with its default options, used through openapi-fetch,
// so that `tsc --strict` checks every path, parameter and body of the
// tour against the types a TypeScript user gets.
//
//   node tour.mjs README.md openapi.yaml build/tour.ts [build/tour-client.ts]
//
// Every curl of the block must name a path of the spec; a body is kept as
// the object literal it is, so a missing required property, an unknown one
// or a value of the wrong type is a type error.
//
// The optional second output is the same tour through the package users
// install, @ipam-dev/client (api/typescript): its createIPAMClient, and its
// unwrap() with each answer declared as the schema the spec gives the
// call's 2xx answers, so that the package's exports, its committed
// generated types and its result typing are checked call by call. make
// lint-api type-checks it where the packed tarball is installed.
import { readFileSync, writeFileSync } from "node:fs";
import yaml from "js-yaml";

const [readmePath, specPath, outPath, clientOutPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node tour.mjs README.md openapi.yaml OUT.ts [CLIENT-OUT.ts]");
  process.exit(2);
}

const readme = readFileSync(readmePath, "utf8");
const start = readme.indexOf("```sh tour\n");
if (start < 0) throw new Error(`${readmePath} has no \`\`\`sh tour block`);
const block = readme.slice(start + "```sh tour\n".length, readme.indexOf("\n```", start + 1));

// Commands: a line starting with curl, continued while a single quote is open.
const commands = [];
let current = null;
for (const line of block.split("\n")) {
  if (current === null) {
    if (!line.startsWith("curl ")) continue;
    current = line;
  } else {
    current += "\n" + line;
  }
  if ((current.match(/'/g) || []).length % 2 === 0) {
    commands.push(current);
    current = null;
  }
}
if (current !== null) throw new Error(`unterminated quote in: ${current}`);
if (commands.length === 0) throw new Error("the tour has no curl command");

// words splits a command as a POSIX shell would for the quoting the tour
// uses: single quotes and plain words.
function words(cmd) {
  const out = [];
  let w = null;
  for (let i = 0; i < cmd.length; i++) {
    const c = cmd[i];
    if (c === "'") {
      const end = cmd.indexOf("'", i + 1);
      w = (w ?? "") + cmd.slice(i + 1, end);
      i = end;
    } else if (/\s/.test(c)) {
      if (w !== null) out.push(w);
      w = null;
    } else {
      w = (w ?? "") + c;
    }
  }
  if (w !== null) out.push(w);
  return out;
}

const spec = yaml.load(readFileSync(specPath, "utf8"));
const templates = Object.keys(spec.paths).map((p) => ({
  path: p,
  names: [...p.matchAll(/\{(\w+)\}/g)].map((m) => m[1]),
  re: new RegExp("^" + p.replace(/\{\w+\}/g, "([^/]+)") + "$"),
}));

function parameterType(op, pathItem, name, where) {
  const params = [...(pathItem.parameters ?? []), ...(op.parameters ?? [])].map((p) =>
    p.$ref ? spec.components.parameters[p.$ref.split("/").pop()] : p,
  );
  const p = params.find((x) => x.name === name && x.in === where);
  if (!p) throw new Error(`the spec has no ${where} parameter ${name}`);
  return p.schema?.type ?? "string";
}

// answerType is the TypeScript type of a call's 2xx bodies as the package
// names them: Schemas["Name"] for a schema of components, undefined for an
// answer without content (204).
function answerType(op) {
  const types = new Set();
  for (const [code, r0] of Object.entries(op.responses ?? {})) {
    if (!/^2/.test(code)) continue;
    const r = r0.$ref ? spec.components.responses[r0.$ref.split("/").pop()] : r0;
    if (!r.content) {
      types.add("undefined");
      continue;
    }
    for (const media of Object.values(r.content)) {
      const ref = media.schema?.$ref;
      // An inline schema has no name to declare; unknown still checks the call.
      types.add(ref?.startsWith("#/components/schemas/") ? `Schemas[${JSON.stringify(ref.split("/").pop())}]` : "unknown");
    }
  }
  if (types.size === 0) throw new Error("an operation of the tour has no 2xx answer");
  return [...types].join(" | ");
}

function literal(value, type) {
  if (type === "integer" || type === "number") return String(Number(value));
  if (type === "boolean") return value === "true" ? "true" : value === "false" ? "false" : JSON.stringify(value);
  return JSON.stringify(value);
}

const calls = [];
const clientCalls = [];
for (const cmd of commands) {
  const argv = words(cmd);
  let method = "GET";
  let url = null;
  let body = null;
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-X") method = argv[++i];
    else if (a === "-d" || a === "--data") body = argv[++i];
    else if (a === "-H" || a === "-o" || a === "-w") i++;
    else if (a.startsWith("-")) continue;
    else url = a;
  }
  if (!url) throw new Error(`no URL in: ${cmd}`);
  const u = new URL(url.startsWith("http") ? url : "http://" + url);
  const t = templates.find((x) => x.re.test(u.pathname));
  if (!t) throw new Error(`${u.pathname} is no path of the spec (in: ${cmd})`);
  const pathItem = spec.paths[t.path];
  const op = pathItem[method.toLowerCase()];
  if (!op) throw new Error(`the spec has no ${method} ${t.path}`);
  const values = u.pathname.match(t.re).slice(1).map(decodeURIComponent);
  const pathParams = t.names.map((n, i) => `${n}: ${literal(values[i], parameterType(op, pathItem, n, "path"))}`);
  const query = [...u.searchParams].map(([k, v]) => `${k}: ${literal(v, parameterType(op, pathItem, k, "query"))}`);
  const init = [];
  if (pathParams.length || query.length) {
    const parts = [];
    if (pathParams.length) parts.push(`path: { ${pathParams.join(", ")} }`);
    if (query.length) parts.push(`query: { ${query.join(", ")} }`);
    init.push(`params: { ${parts.join(", ")} }`);
  }
  if (body !== null) init.push(`body: ${JSON.stringify(JSON.parse(body), null, 2).replace(/\n/g, "\n    ")}`);
  const comment = cmd.split("\n")[0].replace(/\*\//g, "* /");
  const args = `${JSON.stringify(t.path)}${init.length ? `, {\n    ${init.join(",\n    ")},\n  }` : ""}`;
  calls.push(`  // ${comment}\n  await client.${method.toUpperCase()}(${args});`);
  clientCalls.push(
    `  // ${comment}\n  await step(async () => {\n    const answer: ${answerType(op)} = unwrap(await ipam.${method.toUpperCase()}(${args.replace(/\n/g, "\n  ")}));\n    return answer;\n  });`,
  );
}

writeFileSync(
  outPath,
  `// Generated by api/lint/tour.mjs from the README tour; do not edit.
import createClient from "openapi-fetch";
import type { paths } from "./ipam";

export async function tour(baseUrl: string): Promise<void> {
  const client = createClient<paths>({ baseUrl });
${calls.join("\n")}
}
`,
);
console.log(`${outPath}: ${calls.length} calls of the README tour`);

if (clientOutPath) {
  writeFileSync(
    clientOutPath,
    `// Generated by api/lint/tour.mjs from the README tour; do not edit.
// The tour through @ipam-dev/client: run, it prints each answer as the curl
// tour does, the 2xx body or the problem of any other (the last call is bad
// input on purpose).
import { createIPAMClient, ProblemError, unwrap, type Schemas } from "@ipam-dev/client";

async function step(call: () => Promise<unknown>): Promise<void> {
  try {
    const answer = await call();
    console.log(answer === undefined ? "(no content)" : JSON.stringify(answer));
  } catch (e) {
    if (!(e instanceof ProblemError)) throw e;
    console.log(JSON.stringify(e.problem));
  }
}

export async function tour(baseUrl: string, token?: string): Promise<void> {
  const ipam = createIPAMClient({ baseUrl, token });
${clientCalls.join("\n")}
}
`,
  );
  console.log(`${clientOutPath}: ${clientCalls.length} calls of the README tour through @ipam-dev/client`);
}
