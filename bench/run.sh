#!/usr/bin/env bash
# One-command speed report: engine throughput next to this machine's floors.
#
#   bench/run.sh                      # uses build/ (or $BUILD)
#   BUILD=/tmp/b P=512 N=128 REPS=3 THREADS="1 2" bench/run.sh
#
# 1. makes /tmp/gerbil-bench/qwen3-0.6b-bf16 (random weights, Qwen3-0.6B shapes) if missing
# 2. runs bench_floors with that model's bytes/token and params
# 3. runs `gerbil bench -p P -n N -r REPS` for each thread count
# 4. prints: threads | ppP t/s | tgN t/s | decode floor | tg % of floor | prefill floor | pp % of floor
#
# Defaults keep the whole run to a few minutes on a 2-core machine. The numbers are
# only meaningful on an otherwise idle machine: the script prints the load average
# and any busy processes it sees before starting.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
MODEL_DIR="${MODEL_DIR:-/tmp/gerbil-bench/qwen3-0.6b-bf16}"
P="${P:-512}"
N="${N:-128}"
REPS="${REPS:-3}"
THREADS="${THREADS:-1 2}"

for exe in gerbil bench_make_model bench_floors; do
    if [ ! -x "$BUILD/$exe" ]; then
        echo "run.sh: $BUILD/$exe not found; build first: cmake -S . -B build && cmake --build build -j2" >&2
        exit 1
    fi
done

# ---- 1. model
if [ ! -f "$MODEL_DIR/model.safetensors" ] || [ ! -f "$MODEL_DIR/config.json" ]; then
    echo "== creating $MODEL_DIR (random bf16 weights, ~1.2 GB)" >&2
    "$BUILD/bench_make_model" "$MODEL_DIR" --shape qwen3-0.6b --dtype bf16 --seed 1
fi
ST="$MODEL_DIR/model.safetensors"

# Weight bytes per token = the tensor data of the file. The tied embedding is stored
# once and counted once, as the lm_head (the per-token embedding gather is one row).
FILE_BYTES=$(stat -c %s "$ST")
HDR_LEN=$(od -An -t u8 -N 8 "$ST" | tr -d ' ')
MODEL_BYTES=$((FILE_BYTES - 8 - HDR_LEN))
# Params as the engine counts them (tied embedding once): non-embedding + lm_head.
PARAMS=$("$BUILD/gerbil" info --model "$MODEL_DIR" | awk '/^parameters:/ {print $2}')
[ -n "$PARAMS" ] || { echo "run.sh: gerbil info gave no parameter count" >&2; exit 1; }

# ---- machine state
CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $CPU, $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1e6}' /proc/meminfo)"
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
BUSY=$(top -bn1 -w 200 2>/dev/null | awk 'NR > 7 && $9 + 0 >= 20 && $12 != "top" {print $12 " (" $9 "% CPU)"}' | paste -sd, - || true)
if [ -n "$BUSY" ]; then
    echo "== WARNING: other busy processes: $BUSY -- numbers below will be low and noisy" >&2
fi
echo "== model $MODEL_DIR: $PARAMS params, $MODEL_BYTES weight bytes/token; bench: -p $P -n $N -r $REPS"
[ "$P" = 512 ] && [ "$N" = 128 ] && [ "$REPS" = 3 ] || echo "== NOTE: reduced from the standard -p 512 -n 128 -r 3"

# Page the weights in: a file read through the page cache once, so the first timed
# pass does not include disk reads.
cat "$ST" > /dev/null

# ---- 2. floors
MAXT=1
for t in $THREADS; do [ "$t" -gt "$MAXT" ] && MAXT=$t; done
echo "== bench_floors" >&2
FLOORS=$("$BUILD/bench_floors" --threads "$MAXT" --model-bytes "$MODEL_BYTES" --params "$PARAMS" --file "$ST" --json)
jget() { # jget KEY JSON -> number
    printf '%s' "$2" | tr ',{}' '\n\n\n' | awk -F':' -v k="\"$1\"" '{ gsub(/ /, "") } $1 == k { print $2; exit }'
}

# ---- 3. engine
declare -A PP TG
for t in $THREADS; do
    echo "== gerbil bench --threads $t" >&2
    R=$("$BUILD/gerbil" bench --model "$MODEL_DIR" -p "$P" -n "$N" -r "$REPS" --threads "$t" --json)
    PP[$t]=$(jget prompt_tokens_per_s "$R")
    TG[$t]=$(jget gen_tokens_per_s "$R")
done

# ---- 4. report
echo
echo "floors (best of 5):"
printf '| %7s | %14s | %19s | %16s | %19s |\n' threads "DRAM read GB/s" "mmap file read GB/s" "AVX2 FMA GFLOP/s" "AVX-512 FMA GFLOP/s"
printf '|%s|%s|%s|%s|%s|\n' "--------:" "---------------:" "--------------------:" "-----------------:" "--------------------:"
for t in $(seq 1 "$MAXT"); do
    printf '| %7s | %14s | %19s | %16s | %19s |\n' "$t" "$(jget read_gbs_${t}t "$FLOORS")" \
        "$(jget file_read_gbs_${t}t "$FLOORS")" "$(jget fma_gflops_${t}t "$FLOORS")" "$(jget fma512_gflops_${t}t "$FLOORS")"
done
echo
printf '| %7s | %10s | %10s | %18s | %13s | %19s | %13s |\n' threads "pp$P t/s" "tg$N t/s" "decode floor t/s" \
    "tg % of floor" "prefill floor t/s" "pp % of floor"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "--------:" "-----------:" "-----------:" "-------------------:" "--------------:" \
    "--------------------:" "--------------:"
for t in $THREADS; do
    DF=$(jget decode_floor_tps_${t}t "$FLOORS")
    PF=$(jget prefill_floor_tps_${t}t "$FLOORS")
    awk -v t="$t" -v pp="${PP[$t]}" -v tg="${TG[$t]}" -v df="$DF" -v pf="$PF" 'BEGIN {
        printf "| %7d | %10.2f | %10.2f | %18.2f | %12.1f%% | %19.2f | %12.1f%% |\n",
               t, pp, tg, df, (df > 0 ? 100 * tg / df : 0), pf, (pf > 0 ? 100 * pp / pf : 0) }'
done
echo
echo "decode floor = DRAM read GB/s / weight bytes per token; prefill floor = AVX2 FMA FLOP/s / (2 * params)."
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
