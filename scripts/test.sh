#!/usr/bin/env bash
# The test suite: a release build and an AddressSanitizer + UndefinedBehaviorSanitizer
# build, each running every CTest case (unit, golden, end-to-end, command line).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$JOBS"
(cd build && ctest --output-on-failure -j"$JOBS")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGERBIL_SANITIZE=ON
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$JOBS")
