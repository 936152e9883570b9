#!/usr/bin/env bash
# Builds and runs every `gpu`-labelled test, the CUDA example and the device benches, and
# fails if a GPU test was skipped (this script is for machines that have a GPU).
# Budget on one H200: 1-3 min to build (none for a bundle), about 1 min of tests and 1 min
# of benches; every step has a timeout, so a bundle run ends within 7 minutes even if
# something hangs.
#
#   bash scripts/gpu_check.sh                 build here (needs the project's dependencies,
#                                             nvcc and NCCL) and run everything
#   bash scripts/gpu_check.sh bundle [DIR]    build on a machine WITHOUT a GPU and pack the
#                                             binaries + the small libraries they need into
#                                             DIR (default build-gpu-bundle, ~10 MB)
#   bash scripts/gpu_check.sh run [DIR]       run a bundle on the GPU machine (it needs only
#                                             the driver, and libnccl.so.2 somewhere: the
#                                             CUDA toolkit or the nvidia-nccl-cu13 wheel)
# For the device tool of this workplace: run `bundle` here, then
#   run(command="bash scripts/gpu_check.sh run build-gpu-bundle 2>&1 | tee $OUT/gpu_check.log",
#       carry=["build-gpu-bundle"], timeout_s=480)
# Logs and the bench's JSON land in $OUT when it is set, else in the bundle/build dir.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
jobs=$(nproc 2>/dev/null || echo 4)
bench_args=(--benchmark_min_time=0.1 --benchmark_counters_tabular=true)
# One machine: NCCL's bootstrap may use loopback; say why when something fails.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_DEBUG=${NCCL_DEBUG:-WARN}

build() {  # $1: build dir
  mkdir -p "$1"
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAUTOSHARD_WERROR=ON \
        -DAUTOSHARD_BUILD_PACKAGE_TEST=OFF >"$1/configure.log" 2>&1 \
    || { tail -40 "$1/configure.log"; echo "gpu_check: configure failed"; exit 1; }
  local targets=(test_gpu example_cuda_placement)
  for f in bench/device/*.cpp; do targets+=("bench_device_$(basename "${f%.cpp}")"); done
  cmake --build "$1" -j "$jobs" --target "${targets[@]}" \
    || { echo "gpu_check: build failed (are nvcc, the CUDA toolkit and NCCL found? see $1/configure.log)"; exit 1; }
}

# Runs the binaries in $1 (test_gpu, example_cuda_placement, bench_device_*); $2: log dir.
run_all() {
  local dir=$1 logs=$2 failed=0 rc
  mkdir -p "$logs"
  echo "=== gpu_check: devices ==="
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "(no nvidia-smi)"
  if [ "${SKIP_DOCTEST:-0}" = 1 ]; then :; else
  echo "=== gpu_check: test_gpu (doctest) ==="
  timeout 150 "$dir/test_gpu" --duration=true 2>&1 | tee "$logs/test_gpu.log"; rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 77 ]; then echo "gpu_check: FAILED: test_gpu found no CUDA device on a GPU machine"; failed=1
  elif [ "$rc" -ne 0 ]; then echo "gpu_check: FAILED: test_gpu exited $rc"; failed=1; fi
  echo "=== gpu_check: no-device suite ==="
  timeout 30 "$dir/test_gpu" --autoshard-no-device 2>&1 | tail -4; rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "gpu_check: FAILED: no-device suite exited $rc"; failed=1; }
  fi
  echo "=== gpu_check: example_cuda_placement ==="
  timeout 60 "$dir/example_cuda_placement" 0 0 0 0 2>&1 | tee "$logs/example.log"; rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "gpu_check: FAILED: example exited $rc"; failed=1; }
  for b in "$dir"/bench_device_*; do
    [ -x "$b" ] || continue
    echo "=== gpu_check: $(basename "$b") ==="
    timeout 90 "$b" "${bench_args[@]}" --benchmark_out="$logs/$(basename "$b").json" \
      --benchmark_out_format=json 2>&1 | tee "$logs/$(basename "$b").log"; rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "gpu_check: FAILED: $(basename "$b") exited $rc"; failed=1; }
  done
  if [ "$failed" -eq 0 ]; then echo "gpu_check: PASSED"; else echo "gpu_check: FAILED"; fi
  return "$failed"
}

case "$mode" in
  all)
    build build-gpu
    start=$(date +%s)
    echo "=== gpu_check: ctest -L gpu ==="
    (cd build-gpu && timeout 240 ctest -L gpu --output-on-failure --timeout 90 2>&1) | tee build-gpu/ctest-gpu.log
    ctest_rc=${PIPESTATUS[0]}
    if grep -q "(Skipped)" build-gpu/ctest-gpu.log; then
      echo "gpu_check: FAILED: gpu tests were skipped on a machine meant to have a GPU"; ctest_rc=1
    fi
    staged=build-gpu/gpu-bin
    mkdir -p "$staged"
    cp build-gpu/tests/gpu/test_gpu build-gpu/examples/example_cuda_placement build-gpu/bench/device/bench_device_* "$staged"/
    SKIP_DOCTEST=1 run_all "$staged" "${OUT:-build-gpu/gpu-logs}"; rc=$?
    echo "gpu_check: $(( $(date +%s) - start )) s after the build"
    [ "$ctest_rc" -eq 0 ] && [ "$rc" -eq 0 ]
    exit $?
    ;;
  bundle)
    dir=${2:-build-gpu-bundle}
    build build-gpu-stage
    rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/fallback"
    cp build-gpu-stage/tests/gpu/test_gpu build-gpu-stage/examples/example_cuda_placement \
       build-gpu-stage/bench/device/bench_device_* "$dir"/
    strip --strip-debug "$dir"/test_gpu "$dir"/example_cuda_placement "$dir"/bench_device_* 2>/dev/null || true
    # The small libraries the binaries link, except glibc's, the driver's and NCCL (200+ MB:
    # the GPU machine has its own). libstdc++ goes to fallback/: used only if the machine's is older.
    for bin in "$dir"/test_gpu "$dir"/example_cuda_placement "$dir"/bench_device_*; do
      ldd "$bin" | awk '/=> \//{print $3}'
    done | sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
        libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$dir/fallback/" ;;
        *) cp -L "$lib" "$dir/lib/" ;;
      esac
    done
    du -sh "$dir"; ls "$dir" "$dir/lib" "$dir/fallback"
    ;;
  run)
    dir=${2:-build-gpu-bundle}
    [ -x "$dir/test_gpu" ] || { echo "gpu_check: no bundle in $dir (run 'gpu_check.sh bundle $dir' first)"; exit 1; }
    nccl=""
    for cand in $(ldconfig -p 2>/dev/null | awk '/libnccl.so.2 /{print $NF}') /usr/local/cuda/lib64/libnccl.so.2 \
                /usr/lib/x86_64-linux-gnu/libnccl.so.2 \
                "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)"; do
      [ -n "$cand" ] && [ -e "$cand" ] && { nccl=$(dirname "$cand"); break; }
    done
    [ -n "$nccl" ] || nccl=$(dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
    [ -n "$nccl" ] || { echo "gpu_check: libnccl.so.2 not found on this machine"; exit 1; }
    libpath="$PWD/$dir/lib:$nccl"
    sys_stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+.so.6 /{print $NF; exit}')
    if [ -z "$sys_stdcxx" ] || ! grep -q GLIBCXX_3.4.30 "$sys_stdcxx" 2>/dev/null; then libpath="$libpath:$PWD/$dir/fallback"; fi
    export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu_check: NCCL from $nccl; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    start=$(date +%s)
    run_all "$dir" "${OUT:-$dir/logs}"; rc=$?
    echo "gpu_check: $(( $(date +%s) - start )) s"
    exit "$rc"
    ;;
  *)
    sed -n '2,20p' "$0"; exit 2 ;;
esac
