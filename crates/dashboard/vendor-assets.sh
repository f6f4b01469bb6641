#!/usr/bin/env bash
# Vendors the dashboard's browser libraries from npm into assets/vendor/, where
# src/assets.rs embeds them in the binary (nothing is fetched from a CDN at run time).
# Versions are pinned in assets-src/package.json and assets-src/package-lock.json; run
# this after changing them and commit assets/vendor/ with the lockfile.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/assets-src"
npm ci --no-audit --no-fund --loglevel=error
vendor="$here/assets/vendor"
rm -rf "$vendor"
mkdir -p "$vendor"
cp node_modules/@xterm/xterm/lib/xterm.js "$vendor/xterm.js"
cp node_modules/@xterm/xterm/css/xterm.css "$vendor/xterm.css"
cp node_modules/@xterm/addon-fit/lib/addon-fit.js "$vendor/addon-fit.js"
cp node_modules/uplot/dist/uPlot.iife.min.js "$vendor/uplot.js"
cp node_modules/uplot/dist/uPlot.min.css "$vendor/uplot.css"
# Licences travel with the code.
cp node_modules/@xterm/xterm/LICENSE "$vendor/LICENSE.xterm"
cp node_modules/@xterm/addon-fit/LICENSE "$vendor/LICENSE.addon-fit"
cp node_modules/uplot/LICENSE "$vendor/LICENSE.uplot"
rm -rf node_modules
ls -l "$vendor"
