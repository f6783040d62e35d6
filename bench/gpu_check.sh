#!/usr/bin/env bash
# The search and training benchmarks on an NVIDIA GPU, in under 8 minutes, installing nothing
# from the network; figures go to one folder (default bench/results/gpu):
#
#     bash bench/gpu_check.sh [OUT_DIR]
#
# Python: the first of $PYTHON, .venv/bin/python, python3 that imports the project and sees a
# GPU through torch. When none does and $WHEELS_DIR holds wheels carried along (a CUDA torch,
# faiss), they are installed from that folder only (pip --no-index) into a venv under /tmp that
# sees the system's packages. Without a GPU the script says so and runs the CPU fallbacks of
# both benchmarks in their --quick modes, so it can be tested anywhere.
#
# Output: OUT_DIR/gpu_check.md (machine facts and every benchmark's table), the benchmarks' JSON
# (search_*.json, training.json) and OUT_DIR/gpu_check.log (everything printed). BENCHMARKS.md is
# never touched: copy figures from there by hand, with the machine they came from.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-bench/results/gpu}
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/gpu_check.md"
LOG="$OUT_DIR/gpu_check.log"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
START=$(date +%s)
: > "$LOG"

say() { echo "$*" | tee -a "$LOG"; }

imports_ok() { "$1" -c "import torch, faiss, fastapi, numpy, app.vectors.faiss.index" 2>/dev/null; }
sees_gpu() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

PY=""
FALLBACK=""
for candidate in "${PYTHON:-}" .venv/bin/python python3; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
    imports_ok "$candidate" || continue
    [ -z "$FALLBACK" ] && FALLBACK=$candidate
    if sees_gpu "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ] && [ -n "${WHEELS_DIR:-}" ] && [ -d "${WHEELS_DIR}" ] && command -v nvidia-smi >/dev/null 2>&1; then
    say "no Python here sees the GPU; installing the wheels carried in $WHEELS_DIR (no network)"
    python3 -m venv --system-site-packages /tmp/nobackfill-gpu-venv >>"$LOG" 2>&1
    /tmp/nobackfill-gpu-venv/bin/pip install --no-index --find-links "$WHEELS_DIR" \
        "$WHEELS_DIR"/*.whl >>"$LOG" 2>&1
    /tmp/nobackfill-gpu-venv/bin/pip install --no-index --no-deps --no-build-isolation -e . \
        >>"$LOG" 2>&1
    if imports_ok /tmp/nobackfill-gpu-venv/bin/python && sees_gpu /tmp/nobackfill-gpu-venv/bin/python; then
        PY=/tmp/nobackfill-gpu-venv/bin/python
    fi
fi
if [ -z "$PY" ] && [ -z "$FALLBACK" ]; then
    say "no Python with the project's packages found (tried \$PYTHON, .venv/bin/python, python3)"
    exit 1
fi

{
    echo "# GPU check ($(date '+%Y-%m-%d %H:%M'))"
    echo
    echo "nvidia-smi: $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ';' || true)"
} > "$REPORT"
if [ -n "$PY" ]; then
    DEVICE=cuda
    SEARCH_FAST=(--sizes 1000000 --batches 1 16 256 --no-http)
    SEARCH_HTTP=(--sizes 100000 --batches 1 16 256)
    TRAINING=()
    say "GPU found: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))'), python $PY"
else
    PY=$FALLBACK
    DEVICE=cpu
    SEARCH_FAST=(--quick --no-http)
    SEARCH_HTTP=(--quick)
    TRAINING=(--quick)
    say "NO GPU FOUND (nvidia-smi: $(command -v nvidia-smi >/dev/null && echo present || echo absent); torch.cuda.is_available() is False for every Python tried): running the CPU fallbacks in --quick mode with $PY"
fi
echo "device: $DEVICE; python: $PY; $("$PY" -c 'import torch, faiss; print("torch", torch.__version__, "faiss", faiss.__version__)')" >> "$REPORT"
echo >> "$REPORT"

# Each step has its own limit; together they stay under 8 minutes (480 s).
run_step() {
    local limit=$1 name=$2; shift 2
    local tic=$(date +%s)
    say "== $name (limit ${limit}s): $*"
    echo "## $name" >> "$REPORT"
    echo >> "$REPORT"
    echo "\`$*\`" >> "$REPORT"
    echo >> "$REPORT"
    timeout --signal=INT "$limit" "$@" > "$OUT_DIR/$name.out" 2>>"$LOG"
    local rc=$?
    cat "$OUT_DIR/$name.out" >> "$LOG"
    # The markdown table each benchmark prints after its progress lines.
    sed -n '/^Command: /,$p' "$OUT_DIR/$name.out" >> "$REPORT"
    if [ $rc -ne 0 ]; then
        say "$name: exit $rc after $(( $(date +%s) - tic )) s (124/130: stopped at its limit)"
        echo "**$name stopped: exit $rc**" >> "$REPORT"
    else
        say "$name: done in $(( $(date +%s) - tic )) s"
    fi
    echo >> "$REPORT"
}

run_step 200 search_1m "$PY" -m bench.perf.search --device "$DEVICE" "${SEARCH_FAST[@]}" \
    --no-markdown --out "$OUT_DIR/search_fast.json"
run_step 130 search_http "$PY" -m bench.perf.search --device "$DEVICE" "${SEARCH_HTTP[@]}" \
    --no-markdown --out "$OUT_DIR/search_http.json"
run_step 130 training "$PY" -m bench.perf.training --device "$DEVICE" "${TRAINING[@]}" \
    --no-markdown --out "$OUT_DIR/training.json"

say "gpu_check: $(( $(date +%s) - START )) s in all; figures in $REPORT"
