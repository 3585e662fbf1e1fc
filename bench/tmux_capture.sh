#!/usr/bin/env bash
# Start the dashboard in a detached tmux session, let it run, capture the
# screen as text, quit with `q`.
#
#   bench/tmux_capture.sh OUT.txt [SECONDS] [-- gpustation arguments]
#
# e.g. on a GPU machine:   bench/tmux_capture.sh bench/h200-dashboard.txt 8
#      simulated:          bench/tmux_capture.sh /tmp/sim.txt 5 -- --simulate 2
# Environment: COLS/ROWS (default 160x48), GPUSTATION (command, default
# "python -m gpustation" with this checkout's interpreter), KEYS (tmux keys
# sent before the capture, e.g. KEYS="t" for the topology screen).
set -euo pipefail
out=${1:?usage: tmux_capture.sh OUT.txt [SECONDS] [-- gpustation args]}
secs=${2:-8}
shift $(( $# >= 2 ? 2 : 1 ))
[[ ${1:-} == "--" ]] && shift
cols=${COLS:-160}
rows=${ROWS:-48}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
[[ -x $py ]] || py=python3
cmd=${GPUSTATION:-$py -m gpustation}
session=gpustation-capture-$$
tmux new-session -d -s "$session" -x "$cols" -y "$rows" \
    "cd '$here' && TERM=xterm-256color $cmd $* ; sleep 30"
trap 'tmux kill-session -t "$session" 2>/dev/null || true' EXIT
sleep "$secs"
if [[ -n ${KEYS:-} ]]; then
    tmux send-keys -t "$session" $KEYS
    sleep 2
fi
tmux capture-pane -p -t "$session" > "$out"
tmux send-keys -t "$session" q
sleep 1
echo "captured ${cols}x${rows} after ${secs}s to $out"
