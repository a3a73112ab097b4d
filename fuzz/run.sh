#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] [HARNESS...]: build the libFuzzer harnesses (clang, ASan + UBSan +
# float-cast-overflow) in build-fuzz/ and run each for SECONDS (default 20) on a corpus made
# from fuzz/seeds, tests/fixtures and ../shared/data (build-fuzz/corpus, outside git), one
# at a time (-jobs=1 equivalent). Crashes go to build-fuzz/crashes/NAME/; replay one with
# build-fuzz/fuzz/NAME FILE and, once fixed, copy it to tests/fuzz-regress/NAME/ (the
# normal suite replays that folder: CTest NAME_regress). Exit 1 when any harness crashed.
# GERBIL_FUZZ_RUNS=N: stop each harness after N executions instead (long runs, not CI).
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
shift || true
B=${GERBIL_FUZZ_BUILD:-build-fuzz}
JOBS=$(nproc 2>/dev/null || echo 2)
CC=clang cmake -S . -B "$B" -DGERBIL_FUZZ=ON -DGERBIL_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null || exit 1
cmake --build "$B" -j"$JOBS" >/dev/null || { cmake --build "$B" 2>&1 | tail -20; exit 1; }
python3 fuzz/make_corpus.py "$B/corpus" || exit 1
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(fuzz_gguf fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_jinja fuzz_model fuzz_grammar fuzz_http)
declare -A DICT=([fuzz_gguf]=gguf [fuzz_safetensors]=safetensors [fuzz_config]=config [fuzz_tokenizer]=tokenizer
                 [fuzz_jinja]=jinja [fuzz_model]=json [fuzz_grammar]=grammar [fuzz_http]=http)
declare -A MAXLEN=([fuzz_gguf]=310000 [fuzz_safetensors]=160000 [fuzz_config]=16384 [fuzz_tokenizer]=65536
                   [fuzz_jinja]=16384 [fuzz_model]=8192 [fuzz_grammar]=8192
                   [fuzz_http]=16384)
bad=0
for n in "${names[@]}"; do
    mkdir -p "$B/crashes/$n" "$B/corpus/$n"
    cat fuzz/dict/json.dict "fuzz/dict/${DICT[$n]}.dict" > "$B/$n.dict"
    limit=(-max_total_time="$SECS")
    [ -n "${GERBIL_FUZZ_RUNS:-}" ] && limit=(-runs="$GERBIL_FUZZ_RUNS")
    start=$(date +%s)
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$B/fuzz/$n" "${limit[@]}" -max_len="${MAXLEN[$n]}" -timeout=20 -error_exitcode=1 -timeout_exitcode=2 -rss_limit_mb=2560 -malloc_limit_mb=2048 \
        -dict="$B/$n.dict" -artifact_prefix="$B/crashes/$n/" -print_final_stats=1 "$B/corpus/$n" \
        >"$B/$n.log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$B/$n.log" | grep -o '[0-9]*$')
    cov=$(grep -oE '#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED).*cov: [0-9]+ ft: [0-9]+' "$B/$n.log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+')
    printf '%-17s rc=%d  %ss  executions: %s  %s\n' "$n" $rc $(( $(date +%s) - start )) "${execs:-?}" "${cov:-}"
    # libFuzzer reports findings with exit 1 / 2 here (-error_exitcode, -timeout_exitcode), so 77 is the harness
    if [ $rc -eq 77 ]; then echo "  skipped: $(grep -m1 'skipped' "$B/$n.log")"; continue; fi # its data is absent
    if [ $rc -ne 0 ]; then bad=1; grep -E "ERROR|runtime error|SUMMARY|artifact|fuzz_http:" "$B/$n.log" | head -8; fi
done
exit $bad
