#!/usr/bin/env bash
# Re-vendor xterm.js and its fit addon from the npm registry, checking each tarball against the registry's
# dist.integrity. Usage: static/vendor/update-xterm.sh <xterm version> <addon-fit version>
# Then update the table in static/vendor/README.md with the versions and integrity lines printed at the end.
set -euo pipefail

xterm_version=${1:?usage: $0 <@xterm/xterm version> <@xterm/addon-fit version>}
fit_version=${2:?usage: $0 <@xterm/xterm version> <@xterm/addon-fit version>}
vendor_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fetch <package> <version> <directory>: the package's tarball, verified, unpacked into <directory>/package
fetch() {
    local name=$1 version=$2 into=$3 expected tarball actual
    expected=$(npm view "$name@$version" dist.integrity)
    tarball=$(cd "$work" && npm pack --silent "$name@$version")
    actual="sha512-$(openssl dgst -sha512 -binary "$work/$tarball" | openssl base64 -A)"
    if [ "$actual" != "$expected" ]; then
        echo "integrity mismatch for $name@$version: registry $expected, tarball $actual" >&2
        exit 1
    fi
    mkdir -p "$work/$into"
    tar xzf "$work/$tarball" -C "$work/$into"
    echo "$name@$version $expected"
}

# Drop the sourceMappingURL comment of a file whose map is not vendored: Django's ManifestStaticFilesStorage
# rewrites that reference and fails collectstatic when the map is missing.
without_map_reference() {
    grep -v '^//# sourceMappingURL=' "$1" > "$2"
}

fetch @xterm/xterm "$xterm_version" xterm
fetch @xterm/addon-fit "$fit_version" fit

mkdir -p "$vendor_dir/xterm" "$vendor_dir/xterm-addon-fit"
# xterm.js: the UMD bundle (defines the global Terminal), without its 1.9 MB source map.
without_map_reference "$work/xterm/package/lib/xterm.js" "$vendor_dir/xterm/xterm.js"
cp "$work/xterm/package/css/xterm.css" "$vendor_dir/xterm/xterm.css"
cp "$work/xterm/package/LICENSE" "$vendor_dir/xterm/LICENSE"
# The fit addon: the UMD bundle (defines the global FitAddon.FitAddon) with its small source map.
cp "$work/fit/package/lib/addon-fit.js" "$work/fit/package/lib/addon-fit.js.map" "$vendor_dir/xterm-addon-fit/"
cp "$work/fit/package/LICENSE" "$vendor_dir/xterm-addon-fit/LICENSE"
chmod 0644 "$vendor_dir"/xterm/* "$vendor_dir"/xterm-addon-fit/*

echo "vendored into $vendor_dir; sha256 of the files:"
(cd "$vendor_dir" && sha256sum xterm/* xterm-addon-fit/*)
