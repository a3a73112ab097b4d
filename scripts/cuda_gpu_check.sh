#!/usr/bin/env bash
# The CUDA backend's proof on a GPU machine, in one go: build with -DGERBIL_CUDA=ON, the
# op-level suite (test_backend_cuda), every golden fixture and the batch-invariance suite
# with the model on the GPU, then (STAGE=bench or all) gerbil bench tg128/pp512 on
# Qwen3-0.6B-shaped random weights in bf16, Q8_0, Q4_K_M and MLX 4-bit. Logs into $OUT
# (or /tmp) when set. Usage: scripts/cuda_gpu_check.sh [test|bench|all]
# PREBUILT=DIR: take the programs from DIR (built elsewhere with -DGERBIL_CUDA=ON; the
# machine then needs only the shared libraries, e.g. through LD_LIBRARY_PATH) instead of
# building here.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:-all}
LOG=${OUT:-/tmp}
JOBS=$(nproc)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
B=build
if [ -n "${PREBUILT:-}" ]; then
    B=$PREBUILT
else
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGERBIL_CUDA=ON >"$LOG/cmake.log" 2>&1 || { tail -30 "$LOG/cmake.log"; exit 1; }
    t0=$(date +%s)
    cmake --build build -j"$JOBS" >"$LOG/build.log" 2>&1 || { grep -E "error|Error" "$LOG/build.log" | head -30; exit 1; }
    echo "build: $(( $(date +%s) - t0 )) s"
fi
$B/gerbil info --model tests/fixtures/qwen3-f32 2>&1 | tail -4
END=$(( $(date +%s) + ${BUDGET_S:-100000} )) # every step ends by then (a lease's limit)
left() { local l=$(( END - $(date +%s) )); [ $l -lt $1 ] && echo $(( l > 1 ? l : 1 )) || echo $1; }
run() { # name timeout command...
    local name=$1 to=$(left $2); shift 2
    local t=$(date +%s)
    timeout "$to" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc, $(( $(date +%s) - t )) s: $(tail -1 "$LOG/$name.log")"
    [ $rc -ne 0 ] && grep -E "CHECK failed|error|abort|Assert" "$LOG/$name.log" | head -12
}
if [ "$STAGE" != bench ]; then
    run backend_cuda 240 $B/test_backend_cuda
    GERBIL_TEST_BACKEND=cuda run golden_cuda 200 $B/test_golden
    GERBIL_TEST_BACKEND=cuda run golden_quant_cuda 120 $B/test_golden_quant
    GERBIL_TEST_BACKEND=cuda GERBIL_BIN=$(realpath $B/gerbil) GERBIL_MAKE_MODEL=$(realpath $B/bench_make_model) \
        run batch_cuda 300 $B/test_batch
fi
if [ "$STAGE" != test ]; then
    M=/tmp/gerbil-bench
    mkdir -p $M
    [ -f $M/bf16/model.safetensors ] || $B/bench_make_model $M/bf16 --shape qwen3-0.6b --dtype bf16 >/dev/null
    [ -f $M/q8_0.gguf ] || $B/gerbil quantize $M/bf16 $M/q8_0.gguf --type q8_0 >/dev/null 2>&1
    [ -f $M/q4_k_m.gguf ] || $B/gerbil quantize $M/bf16 $M/q4_k_m.gguf --type q4_k_m >/dev/null 2>&1
    [ -d $M/mlx4 ] || $B/gerbil quantize $M/bf16 $M/mlx4 --type mlx4 >/dev/null 2>&1
    for f in q4_k_m.gguf q8_0.gguf bf16 mlx4; do
        bytes=$(du -sb $M/$f | cut -f1)
        timeout $(left 200) $B/gerbil bench --model $M/$f --device cuda -p ${P:-512} -n ${N:-128} -r ${REPS:-3} --json \
            >"$LOG/bench_$f.json" 2>"$LOG/bench_$f.err"
        echo "bench $f ($bytes bytes): $(cat "$LOG/bench_$f.json") $(tail -2 "$LOG/bench_$f.err" | tr '\n' ' ')"
    done
fi
if [ "$STAGE" != test ] && [ -n "${BATCH:-}" ]; then # batched decode: BATCH sequences per step
    timeout $(left 120) $B/gerbil bench --model /tmp/gerbil-bench/q4_k_m.gguf --device cuda -p 0 -n 32 -r 1 \
        --batch "$BATCH" --json 2>/dev/null | sed "s/^/bench q4_k_m --batch $BATCH: /"
fi
