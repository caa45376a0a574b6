#!/usr/bin/env bash
# Refreshes the Swagger UI assets embedded in this package (internal/docs/assets)
# from the npm package swagger-ui-dist, and records the version in assets/VERSION.
#
#   internal/docs/fetch-assets.sh            # the version pinned below
#   internal/docs/fetch-assets.sh 5.36.0     # another version; then pin it here
#
# Needs npm and access to the npm registry. npm checks the package's integrity.
# After a refresh, run `go test ./internal/docs/` and look at /docs in a browser.
set -euo pipefail

VERSION="${1:-5.35.0}"

# Only what the page loads, and the licence texts that must travel with it.
FILES=(
  swagger-ui-bundle.js
  swagger-ui.css
  LICENSE
  NOTICE
  swagger-ui-bundle.js.LICENSE.txt
)

here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

(cd "$tmp" && npm pack --silent "swagger-ui-dist@${VERSION}" >/dev/null)
tar -xzf "$tmp/swagger-ui-dist-${VERSION}.tgz" -C "$tmp"

rm -rf "$here/assets"
mkdir -p "$here/assets"
for f in "${FILES[@]}"; do
  cp "$tmp/package/$f" "$here/assets/$f"
done
echo "$VERSION" >"$here/assets/VERSION"

echo "swagger-ui-dist ${VERSION} -> $here/assets"
