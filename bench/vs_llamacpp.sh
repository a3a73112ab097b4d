#!/usr/bin/env bash
# gerbil vs llama.cpp on the same weights, same files, same thread counts, in one run.
#
#   LLAMA_CPP_BIN=/tmp/llama.cpp/build/bin bench/vs_llamacpp.sh          # uses build/ (or $BUILD)
#   BUILD=/tmp/b P=512 N=128 REPS=3 THREADS="1 2" LLAMA_CPP_BIN=... bench/vs_llamacpp.sh
#   SHAPE=qwen3.5-0.8b MLX_PEER=q4_k_m FORMATS="mlx4 q4_k_m" bench/vs_llamacpp.sh   # issue #5's run
#
# 1. makes /tmp/gerbil-bench/qwen3-0.6b-bf16 (random weights, Qwen3-0.6B shapes, bf16) if
#    missing and copies ../shared/data/tokenizers/qwen3/tokenizer{,_config}.json into it
# 2. gerbil quantize -> bf16.gguf (gerbil's HF -> GGUF converter; llama.cpp must load it)
# 3. llama-quantize bf16.gguf -> the types FORMATS needs (llama.cpp's own quantizer makes the
#    files both engines read), gerbil quantize --type mlx4 -> an MLX folder
# 4. for each thread count, RUNS times in turn (each a fresh process):
#    llama-bench -m F -p P -n N -t T -r REPS --load-mode mmap,none -o json
#    (the better of its two load modes counts; LLAMA_LOAD_MODES) and
#    gerbil bench --model F -p P -n N -t T -r REPS --json, each under /usr/bin/time -v,
#    for Q4_K_M and Q8_0; and gerbil on the MLX 4-bit folder against llama.cpp on the
#    Q4_0 GGUF of the same weights (the nearest 4-bit peer llama.cpp has)
# 5. prints: format | threads | pp and tg of both engines and ratios | max RSS of each
#    against file size + KV cache (f16, P+N tokens, as llama-bench sizes its context)
#
# Both engines get a context of P+N tokens (llama-bench's n_ctx = n_prompt + n_gen).
# llama-bench maps the file (page cache, counted in its RSS once touched); gerbil copies
# the weights into anonymous memory. Run it on an otherwise idle machine: the load average
# is printed before and after. On a 2-core machine the whole run takes ~30 minutes with
# the defaults; RUNS=1, REPS=2 or N=64 shorten it (the output says when changed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
LLAMA_CPP_BIN="${LLAMA_CPP_BIN:-/tmp/llama.cpp/build/bin}"
SHAPE="${SHAPE:-qwen3-0.6b}"            # bench_make_model --shape
MODEL_DIR="${MODEL_DIR:-/tmp/gerbil-bench/$SHAPE-bf16}"
WORK="${WORK:-/tmp/gerbil-bench/vs-llamacpp-$SHAPE}"
# the tokenizer copied into the model (its vocabulary must match the shape's)
# (Qwen3's for both shapes: llama.cpp needs one; gerbil quantize pads the vocabulary to the model's)
DEFTOK=$ROOT/../shared/data/tokenizers/qwen3
TOK="${TOK:-$DEFTOK}"
MLX_PEER="${MLX_PEER:-q4_0}"            # the llama.cpp file the MLX 4-bit folder is compared with
P="${P:-512}"
N="${N:-128}"
REPS="${REPS:-3}"
# Each engine's best run counts (its largest RSS too). On these VMs one process's speed is
# steady across its repetitions but differs between processes: gerbil Q8_0 tg32 at 1 thread
# ran 35.3 or 42.4 tok/s (sd < 1) in six launches of the same binary, llama.cpp 26.5-31.2.
RUNS="${RUNS:-2}"
# Runs with fewer threads than CPUs are pinned (taskset), run k of both engines to the same CPUs,
# the next run to the next ones: on these VMs the two vCPUs differ for minutes at a time (a chain
# of dependent adds ran at 2.4 GHz on one and 3.4 GHz on the other in the same minute), so an
# unpinned 1-thread process's speed depended on where the scheduler put it. PIN=0: no pinning.
PIN="${PIN:-1}"
THREADS="${THREADS:-1 2}"
FORMATS="${FORMATS:-q4_k_m q8_0 mlx4}"
# llama-bench runs each load mode given here and the better number counts: reading a file through
# its mmap ran llama.cpp's decode at half speed or less on these VMs when the file had been written
# recently (20 against 41 tok/s, same bytes; gerbil copies weights into memory, which
# --load-mode none does for llama.cpp). Empty: llama-bench's default only.
LLAMA_LOAD_MODES="${LLAMA_LOAD_MODES-mmap,none}"

for exe in "$BUILD/gerbil" "$BUILD/bench_make_model" "$LLAMA_CPP_BIN/llama-bench" "$LLAMA_CPP_BIN/llama-quantize"; do
    if [ ! -x "$exe" ]; then
        echo "vs_llamacpp.sh: $exe not found (build gerbil with cmake into \$BUILD; LLAMA_CPP_BIN=" \
             "the bin/ folder of a llama.cpp build with llama-bench and llama-quantize)" >&2
        exit 1
    fi
done
command -v python3 >/dev/null || { echo "vs_llamacpp.sh: python3 is needed to read the JSON" >&2; exit 1; }
TIME=/usr/bin/time
[ -x "$TIME" ] || TIME=""
mkdir -p "$WORK"

# ---- 1. model + tokenizer
if [ ! -f "$MODEL_DIR/model.safetensors" ] || [ ! -f "$MODEL_DIR/config.json" ]; then
    echo "== creating $MODEL_DIR (random bf16 weights, ~1.2 GB)" >&2
    "$BUILD/bench_make_model" "$MODEL_DIR" --shape "$SHAPE" --dtype bf16 --seed 1
fi
if [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
    if [ -f "$TOK/tokenizer.json" ]; then
        cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$MODEL_DIR/"
    else
        echo "== NOTE: $TOK absent: the GGUF files get no tokenizer (llama-bench does not need one)" >&2
    fi
fi

# ---- 2./3. files (remade when older than the source)
newer() { [ ! -e "$1" ] || [ "$MODEL_DIR/model.safetensors" -nt "$1" ] || [ "$MODEL_DIR/config.json" -nt "$1" ]; }
if newer "$WORK/bf16.gguf"; then
    echo "== gerbil quantize -> bf16.gguf" >&2
    "$BUILD/gerbil" quantize "$MODEL_DIR" "$WORK/bf16.gguf" --type bf16 2>"$WORK/quantize-bf16.log" ||
        { tail -5 "$WORK/quantize-bf16.log" >&2; exit 1; }
fi
# only the files the chosen FORMATS read (the MLX row reads the MLX_PEER file)
NEEDED=$(for fmt in $FORMATS; do case $fmt in mlx4) echo "$MLX_PEER" ;; *) echo "$fmt" ;; esac; done | sort -u)
for q in $(echo "$NEEDED" | tr a-z A-Z); do
    f="$WORK/$(echo $q | tr A-Z a-z).gguf"
    if [ ! -e "$f" ] || [ "$WORK/bf16.gguf" -nt "$f" ]; then
        echo "== llama-quantize bf16.gguf -> $q" >&2
        "$LLAMA_CPP_BIN/llama-quantize" "$WORK/bf16.gguf" "$f" "$q" "$(nproc)" >"$WORK/llama-quantize-$q.log" 2>&1 ||
            { echo "llama-quantize failed (llama.cpp could not read gerbil's bf16.gguf?):" >&2
              grep -iE "error|failed|exception" "$WORK/llama-quantize-$q.log" | head -10 >&2; exit 1; }
    fi
done
if [ ! -f "$WORK/mlx4/model.safetensors" ] || newer "$WORK/mlx4/model.safetensors"; then
    echo "== gerbil quantize -> mlx4/" >&2
    rm -rf "$WORK/mlx4"
    "$BUILD/gerbil" quantize "$MODEL_DIR" "$WORK/mlx4" --type mlx4 2>"$WORK/quantize-mlx4.log" ||
        { tail -5 "$WORK/quantize-mlx4.log" >&2; exit 1; }
fi

# KV cache bytes at P+N tokens, f16 K and V (both engines' default)
KV_BYTES=$(python3 -c "
import json; c = json.load(open('$MODEL_DIR/config.json'))
hd = c.get('head_dim') or c['hidden_size'] // c['num_attention_heads']
every = c.get('full_attention_interval')   # hybrids: only attention layers keep K and V
n_attn = c['num_hidden_layers'] // every if every else c['num_hidden_layers']
print(n_attn * c.get('num_key_value_heads', c['num_attention_heads']) * hd * 2 * 2 * ($P + $N))")

# ---- machine state
CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $CPU, $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1e6}' /proc/meminfo)"
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
BUSY=$(top -bn1 -w 200 2>/dev/null | awk 'NR > 7 && $9 + 0 >= 20 && $12 != "top" {print $12 " (" $9 "% CPU)"}' | paste -sd, - || true)
[ -z "$BUSY" ] || echo "== WARNING: other busy processes: $BUSY -- numbers below will be low and noisy" >&2
echo "== -p $P -n $N -r $REPS, threads: $THREADS; $("$BUILD/gerbil" --version) (repo HEAD $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), binary from $BUILD), llama.cpp $(git -C "$LLAMA_CPP_BIN/../.." rev-parse --short HEAD 2>/dev/null || echo "$LLAMA_CPP_BIN")"
[ "$P" = 512 ] && [ "$N" = 128 ] && [ "$REPS" = 3 ] && [ "$RUNS" = 2 ] ||
    echo "== NOTE: changed from the standard -p 512 -n 128 -r 3, RUNS=2"

# timed OUT_JSON RSS_FILE CMD...: run CMD, stdout to OUT_JSON, max RSS (kB) to RSS_FILE
timed() {
    local out=$1 rss=$2; shift 2
    if [ -n "$TIME" ]; then
        "$TIME" -v -o "$rss.time" "$@" >"$out" 2>"$out.err" || { echo "FAILED: $*" >&2; tail -5 "$out.err" >&2; return 1; }
        awk -F': ' '/Maximum resident set size/ {print $2}' "$rss.time" >"$rss"
    else
        "$@" >"$out" 2>"$out.err" || { echo "FAILED: $*" >&2; tail -5 "$out.err" >&2; return 1; }
        echo 0 >"$rss"
    fi
}

ROWS="$WORK/rows.txt"
: >"$ROWS"
for fmt in $FORMATS; do
    case $fmt in
        mlx4) GF="$WORK/mlx4"; LF="$WORK/$MLX_PEER.gguf"; label="MLX 4-bit g64 vs $(echo $MLX_PEER | tr a-z A-Z)"
              FBYTES=$(stat -c %s "$WORK/mlx4/model.safetensors") ;;
        *) GF="$WORK/$fmt.gguf"; LF="$GF"; label=$(echo "$fmt" | tr a-z A-Z); FBYTES=$(stat -c %s "$GF") ;;
    esac
    LBYTES=$(stat -c %s "$LF")
    cat "$GF"/model.safetensors "$GF" "$LF" >/dev/null 2>&1 || true   # page cache warm for both
    for t in $THREADS; do
        for k in $(seq "$RUNS"); do
            pin=()
            if [ "$PIN" = 1 ] && [ "$t" -lt "$(nproc)" ] && command -v taskset >/dev/null; then
                pin=(taskset -c "$(for i in $(seq 0 $((t - 1))); do echo $(( ((k - 1) * t + i) % $(nproc) )); done | paste -sd, -)")
            fi
            echo "== $label, $t thread(s), run $k/$RUNS${pin:+ (${pin[*]})}: llama-bench" >&2
            timed "$WORK/l$k.json" "$WORK/l$k.rss" "${pin[@]}" "$LLAMA_CPP_BIN/llama-bench" -m "$LF" -p "$P" -n "$N" \
                -t "$t" -r "$REPS" ${LLAMA_LOAD_MODES:+--load-mode "$LLAMA_LOAD_MODES"} -o json
            echo "== $label, $t thread(s), run $k/$RUNS${pin:+ (${pin[*]})}: gerbil bench" >&2
            timed "$WORK/g$k.json" "$WORK/g$k.rss" "${pin[@]}" "$BUILD/gerbil" bench --model "$GF" -p "$P" -n "$N" \
                -t "$t" -r "$REPS" -c $((P + N)) --json
        done
        python3 - "$label" "$t" "$WORK" "$RUNS" "$FBYTES" "$LBYTES" "$KV_BYTES" >>"$ROWS" <<'EOF'
import json, sys
label, t, work, runs, fb, lb, kv = sys.argv[1:]
ks = range(1, int(runs) + 1)
gs = [json.load(open(f"{work}/g{k}.json")) for k in ks]
ls = [r for k in ks for r in json.load(open(f"{work}/l{k}.json"))]
grss = max(int(open(f"{work}/g{k}.rss").read() or 0) for k in ks)
lrss = max(int(open(f"{work}/l{k}.rss").read() or 0) for k in ks)
# each engine's best run; for llama.cpp also the better of its load modes (LLAMA_LOAD_MODES)
lpp = max((r["avg_ts"] for r in ls if r["n_prompt"] > 0 and r["n_gen"] == 0), default=0.0)
ltg = max((r["avg_ts"] for r in ls if r["n_gen"] > 0 and r["n_prompt"] == 0), default=0.0)
gpp = max(g.get("prompt_tokens_per_s", 0.0) for g in gs)
gtg = max(g.get("gen_tokens_per_s", 0.0) for g in gs)
r = lambda a, b: f"{a / b:.2f}x" if b else "-"
mb = lambda x: float(x) / 2**20
gbud, lbud = (int(fb) + int(kv)), (int(lb) + int(kv))
print(f"| {label} | {t} | {gpp:.1f} | {lpp:.1f} | {r(gpp, lpp)} | {gtg:.2f} | {ltg:.2f} | {r(gtg, ltg)} | "
      f"{int(grss) / 1024:.0f} ({100 * int(grss) * 1024 / gbud:.0f}%) | {int(lrss) / 1024:.0f} ({100 * int(lrss) * 1024 / lbud:.0f}%) | "
      f"{mb(fb):.0f} / {mb(lb):.0f} + {mb(kv):.0f} |")
EOF
        tail -1 "$ROWS" >&2
    done
done

echo
printf '| format | threads | gerbil pp%s t/s | llama.cpp pp%s t/s | ratio | gerbil tg%s t/s | llama.cpp tg%s t/s | ratio | gerbil max RSS MiB (%% of file+KV) | llama.cpp max RSS MiB (%% of file+KV) | file MiB gerbil / llama.cpp + KV MiB |\n' "$P" "$P" "$N" "$N"
echo '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|'
cat "$ROWS"
echo
echo "ratio = gerbil / llama.cpp (targets: tg >= 1.2x, pp >= 1.0x; RSS <= 110% of file + KV)."
echo "KV = f16 K and V for $((P + N)) tokens. The MLX row compares gerbil on the MLX folder with llama.cpp on $MLX_PEER."
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
