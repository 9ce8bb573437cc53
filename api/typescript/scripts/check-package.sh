#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# check-package.sh packs @ipam-dev/client as users would get it and checks
# the tarball from the outside (make lint-api runs it after npm ci):
#
#   scripts/check-package.sh [TOUR-CLIENT.ts]
#
# 1. npm pack (its prepack builds dist/ with tsc) into build/;
# 2. a new project in a temporary directory outside the repository, so
#    nothing resolves from the checkout's node_modules, installs the
#    tarball with `npm install ./TARBALL` (which fetches openapi-fetch as
#    the package's declared dependency);
# 3. tsc --strict type-checks example/example.ts (the README's usage) and
#    the README tour through the package (TOUR-CLIENT.ts, from
#    api/lint/tour.mjs) against what was installed, under Node.js's own
#    module resolution and under a bundler's;
# 4. node --test runs test/client.test.mjs against the installed dist/.
set -euo pipefail
tour=${1:+$(realpath "$1")}
cd "$(dirname "$0")/.."
pkg=$PWD

rm -rf build && mkdir -p build
npm pack --pack-destination build --loglevel=error >/dev/null
tarball=$(ls build/*.tgz)
[ "$(echo "$tarball" | wc -l)" = 1 ] || { echo "expected one tarball in build/: $tarball"; exit 1; }
# What package.json's exports and types name must be in the tarball.
listing=$(tar tzf "$tarball")
for f in package/package.json package/README.md package/dist/index.js package/dist/index.d.ts package/dist/schema.d.ts; do
	grep -qx "$f" <<<"$listing" || { echo "$tarball lacks $f"; exit 1; }
done
echo "$tarball: $(grep -c . <<<"$listing") files, $(stat -c %s "$tarball") bytes"

tmp=$(mktemp -d)
trap 'rc=$?; if [ $rc = 0 ]; then rm -rf "$tmp"; else echo "the consumer project is left in $tmp"; fi; exit $rc' EXIT
cd "$tmp"
echo '{"name": "ipam-client-consumer", "private": true, "type": "module"}' >package.json
npm install --no-audit --no-fund --loglevel=error --no-package-lock "$pkg/$tarball" >/dev/null
cp "$pkg/example/example.ts" "$pkg/test/client.test.mjs" .
files='"example.ts"'
if [ -n "$tour" ]; then cp "$tour" tour-client.ts; files="$files, \"tour-client.ts\""; fi
cat >tsconfig.json <<EOF
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "target": "es2022",
    "module": "nodenext",
    "moduleResolution": "nodenext",
    "lib": ["es2022", "dom"],
    "types": []
  },
  "files": [$files]
}
EOF
"$pkg/node_modules/.bin/tsc" -p tsconfig.json
# The declarations were checked in the pass above; this one only asks
# whether a bundler's resolution finds them, and skipping their check
# halves its time.
"$pkg/node_modules/.bin/tsc" -p tsconfig.json --module esnext --moduleResolution bundler --skipLibCheck
echo "tsc --strict: $files against the installed tarball (nodenext and bundler resolution)"
node --test --test-reporter=spec client.test.mjs
