#!/usr/bin/env bash
# The read-only checks on a real GPU, in one go; each part writes its figures
# under OUT_DIR, bounded by a timeout of its own. Nothing here changes a GPU
# setting: the power limit is read before and after, and must not move.
#
#   bench/real_gpu_checks.sh OUT_DIR [PART ...]
#
# PARTs (default: all, in this order): memtemp shared phases doctor dashboard
# forecast-lora forecast-resnet slowdown. PYTHON names the interpreter
# (default python3). The forecast parts run without torch.compile and with
# fewer steps than the presets, to fit the time: each says so in its JSON.
set -u
out=${1:?usage: bench/real_gpu_checks.sh OUT_DIR [PART ...]}
shift
parts=${*:-memtemp shared phases doctor dashboard forecast-lora forecast-resnet slowdown}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
mkdir -p "$out"

limits() {
  nvidia-smi --query-gpu=index,name,power.limit,enforced.power.limit --format=csv,noheader
}

run() {  # NAME SECONDS COMMAND...: the part's output in OUT_DIR/NAME.txt, its time in the log
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$secs" "$@" >"$out/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$out/parts.log"
}

limits >"$out/limits-before.csv"
for part in $parts; do
  case $part in
    memtemp) run memtemp 120 "$py" bench/memory_temperature.py --idle 1 --load-s 20 --every-s 10 \
      --out "$out/memtemp.json" ;;
    shared) run shared 180 "$py" bench/shared_energy.py --gpu 0 --seconds 25 ;;
    phases)
      run phases 60 "$py" bench/startup_phases.py
      run phases-S 60 "$py" -S bench/startup_phases.py
      "$py" -X importtime -c "import gpustation.tui.app" 2>"$out/importtime.txt" ;;
    doctor) run doctor 90 "$py" -m gpustation doctor ;;
    dashboard) run dashboard 300 "$py" bench/dashboard_cpu.py --real --nvitop --no-reference \
      --rounds 1 --steady 15 ;;
    forecast-lora) run forecast-lora 200 "$py" bench/forecast_check.py --presets lora-tiny \
      --steps 100 --set compile=false --run-timeout 60 --out "$out/forecast-lora.json" ;;
    forecast-resnet) run forecast-resnet 330 "$py" bench/forecast_check.py \
      --presets resnet50-bf16 --steps 100 --set compile=false --run-timeout 120 \
      --out "$out/forecast-resnet.json" ;;
    slowdown) run slowdown 240 "$py" bench/slowdown_check.py --gpu 0 --out "$out/slowdown.json" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
limits >"$out/limits-after.csv"
if cmp -s "$out/limits-before.csv" "$out/limits-after.csv"; then
  echo "power limits as before" | tee -a "$out/parts.log"
else
  echo "POWER LIMITS CHANGED" | tee -a "$out/parts.log"
fi
