#!/usr/bin/env bash
# Regenerate docs/example/: the HTML report of the README's demo (demo-lab) and its screenshot.
# Run from anywhere with the project's venv active (`planner` on PATH); needs Debian's
# chromium and websocket-client for the screenshot (pip install -e '.[test]').
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/example
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the README's first command: the lab demo, its benchmark and its untraced step time
planner analyze demo-lab --network demo-lab/network.csv --untraced-step-time 0.0918 \
  -o "$work/planner-out" > /dev/null
planner report "$work/planner-out"
mkdir -p "$out"
cp "$work/planner-out/report.html" "$out/report.html"
python -m tests.browser_cdp "$out/report.html" "$out/report.png"
echo "wrote $out/report.html $out/report.png"
