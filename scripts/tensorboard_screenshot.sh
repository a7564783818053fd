#!/usr/bin/env bash
# A screenshot of a run's TensorBoard (the README's picture): TensorBoard serves the run's event files and headless
# Chromium draws the time-series page, its charts as SVG (headless Chromium has no WebGL).
#   scripts/tensorboard_screenshot.sh runs/mixed_rewards_tiny docs/tensorboard.png ['^(eval/iou|reward/total)$']
# Needs the tensorboard extra and Chromium (`apt-get install chromium`); fails loudly without either.
set -euo pipefail
run=${1:?usage: $0 RUN_DIR OUT.png [TAG_REGEX]}
out=${2:?usage: $0 RUN_DIR OUT.png [TAG_REGEX]}
tags=${3:-'^(eval/iou|reward/(total|box_giou|box_size))$'}
here=$(cd "$(dirname "$0")/.." && pwd)
tensorboard="$here/.venv/bin/tensorboard"
[ -x "$tensorboard" ] || { echo "no $tensorboard: pip install 'mmrl[tensorboard]'" >&2; exit 1; }
chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$chromium" ] || { echo "no Chromium: apt-get install chromium" >&2; exit 1; }
[ -d "$run/tensorboard" ] || { echo "$run has no tensorboard/ folder: train with trainer.log_with=[jsonl,tensorboard]" >&2; exit 1; }
port=$((6100 + RANDOM % 800))
"$tensorboard" --logdir "$run/tensorboard" --port "$port" --host 127.0.0.1 >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.5; done
filter=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$tags")
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 \
  --virtual-time-budget=60000 --screenshot="$out" \
  "http://127.0.0.1:$port/?forceSVG=true&tagFilter=$filter#timeseries" 2>/dev/null
echo "wrote $out"
