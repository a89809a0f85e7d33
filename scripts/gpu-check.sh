#!/usr/bin/env bash
# The GPU check: on an NVIDIA GPU with PyTorch installed, and without Rust, with binaries built
# beforehand on another machine, it
#   1. prints the device, the driver and PyTorch's version;
#   2. checks that each GPU path trains as flex does (`burn-lra check-backend`: three AdamW steps
#      from the same weights, logits compared) for the benchmarked attentions;
#   3. times a training step of ListOps' `small` model (`cargo xtask bench lra`) at the lengths
#      given, batch 32, for softmax, linear, performer, gla and deltanet, on each GPU path
#      (wgpu unfused, wgpu fused, libtorch on CUDA) beside PyTorch on CUDA, in this one run;
#   4. trains ListOps `small` with softmax for a fixed number of steps on libtorch's CUDA path
#      (validation and test included) and reports its time;
#   5. prints one table of the step times (the last thing it prints), and writes it, the
#      benchmarks' JSON and a log under the output folder.
#
# Prepare the binaries here (x86-64 Linux; needs PyTorch 2.11's wheel for libtorch's headers):
#     scripts/gpu-check.sh --build        # -> target/gpu-check/{burn-lra,burn-lra-fused,xtask}
# then, on the GPU machine, from the repository's root:
#     scripts/gpu-check.sh
# Without a GPU the same script runs its CPU paths (`GPU_CHECK_CPU=1`: libtorch on the CPU,
# wgpu on lavapipe, PyTorch on the CPU), which is how it is tested.
#
# Settings (environment): GPU_CHECK_BIN (the binaries' folder, default target/gpu-check),
# GPU_CHECK_OUT (output folder; default $OUT where set, else target/gpu-check/out),
# GPU_CHECK_LENGTHS (default 2000,1000: the longer first), GPU_CHECK_BUDGET_S (default 450), GPU_CHECK_STEPS (the ListOps run's steps, default 300),
# GPU_CHECK_CPU=1 (the CPU paths), GPU_CHECK_TORCH_WHEEL (for --build: the PyTorch wheel whose
# libtorch the binaries link, default: pip downloads torch 2.11.0).
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${GPU_CHECK_BIN:-target/gpu-check}
RESULTS=${GPU_CHECK_OUT:-${OUT:-target/gpu-check/out}}
LENGTHS=${GPU_CHECK_LENGTHS:-2000,1000}
STEPS=${GPU_CHECK_STEPS:-300}
ATTENTIONS=softmax,linear,performer,gla,deltanet

# --build: the three binaries, stripped. libtorch comes from PyTorch 2.11's wheel (the GPU
# machine's version: tch 0.22 is written for 2.9, whose C++ API 2.11 keeps for what tch uses),
# unpacked under target/gpu-check/libtorch.
if [ "${1:-}" = "--build" ]; then
    set -e
    mkdir -p "$BIN"
    libtorch="$BIN/libtorch"
    if [ ! -d "$libtorch/torch/lib" ]; then
        wheel=${GPU_CHECK_TORCH_WHEEL:-}
        if [ -z "$wheel" ]; then
            python3 -m pip download --no-deps --only-binary=:all: torch==2.11.0 -d "$BIN/wheel"
            wheel=$(ls "$BIN"/wheel/torch-2.11.0-*.whl | head -1)
        fi
        mkdir -p "$libtorch"
        unzip -q -o "$wheel" 'torch/include/*' 'torch/lib/*' 'torch/share/*' -d "$libtorch"
    fi
    export LIBTORCH="$(realpath "$libtorch/torch")" LIBTORCH_BYPASS_VERSION_CHECK=1
    # libtorch_cuda's own CUDA libraries are the GPU machine's, absent here: a `cc` first in
    # PATH links with -Wl,--allow-shlib-undefined (through PATH rather than RUSTFLAGS or a
    # linker setting, either of which cargo counts as a change that rebuilds every crate).
    mkdir -p "$BIN/link"
    cat > "$BIN/link/cc" <<'WRAPPER'
#!/bin/sh
case " $* " in *" -c "*) exec /usr/bin/cc "$@" ;; esac
exec /usr/bin/cc "$@" -Wl,--allow-shlib-undefined
WRAPPER
    chmod +x "$BIN/link/cc"
    export PATH="$(realpath "$BIN/link"):$PATH"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/gpu-check/cargo}
    cargo build --release -p burn-lra --features wgpu,tch
    cp "$CARGO_TARGET_DIR"/release/burn-lra "$BIN/burn-lra"
    cargo build --release -p burn-lra --features wgpu-fused
    cp "$CARGO_TARGET_DIR"/release/burn-lra "$BIN/burn-lra-fused"
    cargo build --release -p xtask
    cp "$CARGO_TARGET_DIR"/release/xtask "$BIN/xtask"
    strip "$BIN/burn-lra" "$BIN/burn-lra-fused" "$BIN/xtask"
    ls -l "$BIN"
    exit 0
fi

mkdir -p "$RESULTS"
LOG="$RESULTS/gpu-check.log"
exec > >(tee "$LOG") 2>&1
section() { printf '\n== %s (%s s)\n' "$1" "$SECONDS"; }

if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    TCH=tch TORCH_DEVICE=cpu
else
    TCH=tch-cuda TORCH_DEVICE=cuda
fi
for binary in burn-lra burn-lra-fused xtask; do
    if [ ! -x "$BIN/$binary" ]; then
        echo "error: $BIN/$binary is missing: build the binaries with scripts/gpu-check.sh --build"
        exit 1
    fi
done

# libtorch: the installed PyTorch's libraries.
TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || {
    echo "error: python3 cannot import torch"
    exit 1
}
export LD_LIBRARY_PATH="$TORCH_LIB:${LD_LIBRARY_PATH:-}"
# The benchmarks' PyTorch side imports ../bench/torch_attention.py and the PyPI packages of
# `cargo xtask bench setup` (performer-pytorch and what it imports); wheels carried to a machine
# without network access can be installed into $GPU_CHECK_SITE first.
[ -n "${GPU_CHECK_SITE:-}" ] && export PYTHONPATH="$GPU_CHECK_SITE:${PYTHONPATH:-}"

section "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: none (no NVIDIA driver)"
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
"$BIN/burn-lra" backends
"$BIN/burn-lra-fused" backends | grep wgpu-fused

# Each step runs under a time limit of its own (seconds), and all of them within one budget
# (GPU_CHECK_BUDGET_S, default 450 s): a step that would start past it is skipped, one that would
# run past it is cut short, so that the table is always printed.
BUDGET=${GPU_CHECK_BUDGET_S:-450}
END=$((SECONDS + BUDGET))
# The benchmarks take at most two thirds of it, the checks and the ListOps run the rest.
DEADLINE=$((SECONDS + BUDGET * 2 / 3))
# Its notes go to stderr, which a pipe that filters the command's output passes on untouched.
limit() { # seconds command...
    local seconds=$1 left=$((DEADLINE - SECONDS))
    shift
    if [ "$left" -lt 5 ]; then
        echo "(skipped, past the budget: $*)" >&2
        return 124
    fi
    [ "$seconds" -gt "$left" ] && seconds=$left
    timeout "$seconds" "$@"
    local status=$?
    [ $status -eq 124 ] && echo "(stopped at its limit of $seconds s: $*)" >&2
    return $status
}

section "training steps, ListOps small, batch 32: PyTorch on $TORCH_DEVICE beside each path"
# One case a command, so that a case cut short loses only itself.
bench() { # seconds harness backend n attention [flags...]
    local seconds=$1 harness=$2 backend=$3 n=$4 attention=$5
    shift 5
    limit "$seconds" "$BIN/xtask" bench lra --harness "$BIN/$harness" --backend "$backend" \
        --task listops --preset small --lengths "$n" --batch 32 --attention "$attention" \
        --reps 5 --warmup 2 --rounds 1 --timeout 120 --torch-device "$TORCH_DEVICE" \
        --out "$RESULTS/$backend-$n-$attention" --replace "$@" | grep -E 'ours:|torch:|error|fail'
}
IFS=, read -r -a lengths <<< "$LENGTHS"
IFS=, read -r -a attentions <<< "$ATTENTIONS"
# The fused path last at each length, with a longer limit: on a GPU its first run of a shape
# autotunes (the H200 run of 2026-11-30 spent more than 40 s on each fused case with an empty
# cache, and 23-39 s with one filled by an earlier case).
for n in "${lengths[@]}"; do
    for attention in "${attentions[@]}"; do
        bench 40 burn-lra "$TCH" "$n" "$attention"
        bench 30 burn-lra wgpu "$n" "$attention" --no-torch
    done
    for attention in "${attentions[@]}"; do
        bench 75 burn-lra-fused wgpu-fused "$n" "$attention" --no-torch
    done
done

DEADLINE=$END
section "agreement with flex ($ATTENTIONS)"
limit 25 "$BIN/burn-lra" check-backend --backend "$TCH" --attention "$ATTENTIONS"
limit 35 "$BIN/burn-lra-fused" check-backend --backend wgpu-fused --attention "$ATTENTIONS"
limit 35 "$BIN/burn-lra" check-backend --backend wgpu --attention "$ATTENTIONS"

section "ListOps small, softmax, $STEPS steps on $TCH"
# The preset's model and recipe; the training set cut to the examples the steps read.
runs="$RESULTS/runs"
started=$SECONDS
limit 75 "$BIN/burn-lra" train --task listops --preset small --attention softmax --backend "$TCH" \
    --set training.steps="$STEPS" --set training.eval_every="$STEPS" \
    --set training.schedule.warmup=$((STEPS / 5)) \
    --set data.generate.n_train=$((STEPS * 32)) --out "$runs" --no-progress \
    && echo "listops_run_s=$((SECONDS - started))" | tee "$RESULTS/listops-run.txt"

section "table"
python3 - "$RESULTS" "$TCH" <<'EOF'
import json, pathlib, sys
results, tch = pathlib.Path(sys.argv[1]), sys.argv[2]
paths = [tch, "wgpu-fused", "wgpu"]
step, torch, reports = {}, {}, []
for path in sorted(results.glob("*/lra-listops-small-*.json")):
    report = json.loads(path.read_text())
    reports.append(report)
    backend = report["backend"]
    for case in report["cases"]:
        key = (case["attention"], case["n"])
        ours = case.get("ours") or {}
        if "step_ms" in ours:
            step[key, backend] = ours["step_ms"]
        if (case.get("torch") or {}).get("step_ms"):
            torch[key] = case["torch"]["step_ms"]
keys = sorted({k for k, _ in step} | set(torch), key=lambda k: (k[1], k[0]))
cell = lambda ms, ref: "-" if ms is None else (f"{ms:.1f} ({ms / ref:.2f}x)" if ref else f"{ms:.1f}")
lines = ["| attention | n | PyTorch ms | " + " | ".join(f"{p} ms (/ PyTorch)" for p in paths) + " |",
         "|---|---|---|" + "---|" * len(paths)]
for attention, n in keys:
    ref = torch.get((attention, n))
    row = [attention, str(n), "-" if ref is None else f"{ref:.1f}"]
    row += [cell(step.get(((attention, n), p)), ref) for p in paths]
    lines.append("| " + " | ".join(row) + " |")
run = results / "listops-run.txt"
if run.exists():
    lines.append("")
    lines.append(f"ListOps small, softmax, {tch}: {run.read_text().strip()}")
table = "\n".join(lines)
(results / "gpu-check.md").write_text(table + "\n")
(results / "gpu-check.json").write_text(json.dumps(reports, indent=1) + "\n")
print(table)
EOF
