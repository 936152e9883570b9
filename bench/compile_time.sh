#!/usr/bin/env bash
# Compile-time cost of typed specs and of each area's umbrella header. Generates these
# translation units and compiles each one three times (median wall seconds):
#   baseline   : #include <vector> only
#   header     : #include <autoshard/autoshard.hpp> only
#   N types    : N distinct sharded_tensor types, each with a plan_to<> and a local_shape
#                static_assert (the plan is computed by the compiler)
#   <area>     : one include of include/autoshard/<area>/<area>.hpp, for every area that
#                has an umbrella header (what a file pays for using that area); gloo also
#                with AUTOSHARD_TCP_STORE_SEPARATE (its TCP store compiled in another file)
# and prints them side by side with the ratio to the baseline.
#   bench/compile_time.sh              # g++, 200 types
#   CXX=clang++ N=400 bench/compile_time.sh
#   AREAS=0 bench/compile_time.sh      # without the per-area rows
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
include="$here/../include"
cxx="${CXX:-g++}"
n="${N:-200}"
# Eigen and the CUDA headers are not on the default search path on every system.
flags=(-std=c++20 -O0 -c -o /dev/null -I"$include")
for d in /usr/include/eigen3 /usr/local/include/eigen3; do [[ -d $d ]] && flags+=(-isystem "$d"); done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

printf '#include <vector>\nint main() { std::vector<int> v{1}; return v[0] - 1; }\n' > "$work/baseline.cpp"
printf '#include <autoshard/autoshard.hpp>\nint main() { return 0; }\n' > "$work/header.cpp"

# Every spec of a 2-D mesh over R, S(0), S(1), P, and the pairs a plan exists for
# (Shard cannot become Partial); type i gets pair i mod count and its own shape.
placements=("R" "S(0)" "S(1)" "P")
specs=()
for a in "${placements[@]}"; do for b in "${placements[@]}"; do specs+=("[$a,$b]"); done; done
pairs=()
for s in "${specs[@]}"; do
  for d in "${specs[@]}"; do
    sa=${s:1:-1}; da=${d:1:-1}
    bad=0
    for ax in 0 1; do
      sp=$(cut -d, -f$((ax + 1)) <<< "$sa"); dp=$(cut -d, -f$((ax + 1)) <<< "$da")
      [[ $sp == S* && $dp == P ]] && bad=1
    done
    [[ $bad == 0 ]] && pairs+=("$s|$d")
  done
done
{
  echo '#include <autoshard/autoshard.hpp>'
  echo 'namespace as = autoshard;'
  for ((i = 0; i < n; ++i)); do
    p="${pairs[$((i % ${#pairs[@]}))]}"
    src="${p%%|*}"; dst="${p##*|}"
    rows=$((64 + i)); cols=$((32 + i % 7))
    echo "using t$i = as::sharded_tensor<float, as::mesh_extents<2, 4>, \"$src\", $rows, $cols>;"
    echo "static_assert(t$i::plan_to<\"$dst\">().size() <= 4);"
    echo "static_assert(t$i::local_shape(7).numel() <= $rows * $cols);"
  done
  echo 'int main() { return 0; }'
} > "$work/types.cpp"

# Median of three compiles: "wall cpu" seconds (cpu = user + sys, steadier on a shared machine).
# median3 FILE [EXTRA FLAGS...]
median3() {
  local walls=() cpus=() out src=$1
  shift
  for _ in 1 2 3; do
    out=$( { TIMEFORMAT='%R %U %S'; time "$cxx" "${flags[@]}" "$@" "$src"; } 2>&1 )
    read -r r u s <<< "$out"
    walls+=("$r")
    cpus+=("$(echo "$u + $s" | bc -l)")
  done
  echo "$(printf '%s\n' "${walls[@]}" | sort -g | sed -n 2p) $(printf '%s\n' "${cpus[@]}" | sort -g | sed -n 2p)"
}

read -r base_w base_c <<< "$(median3 "$work/baseline.cpp")"
read -r head_w head_c <<< "$(median3 "$work/header.cpp")"
read -r types_w types_c <<< "$(median3 "$work/types.cpp")"
printf '%s, median of 3 compiles (-O0 -c), %d spec pairs cycled over %d types\n' "$("$cxx" --version | head -1)" \
  "${#pairs[@]}" "$n"
printf '%-30s %9s %9s %9s\n' "translation unit" "wall s" "cpu s" "cpu ratio"
row() { printf '%-30s %9.3f %9.3f %9.2f\n' "$1" "$2" "$3" "$(echo "$3 / $base_c" | bc -l)"; }
row "<vector> only" "$base_w" "$base_c"
row "<autoshard/autoshard.hpp>" "$head_w" "$head_c"
row "$n sharded_tensor + plan_to" "$types_w" "$types_c"

if [[ "${AREAS:-1}" != 0 ]]; then
  for dir in "$include"/autoshard/*/; do
    area="$(basename "$dir")"
    [[ -f "$dir/$area.hpp" ]] || continue
    printf '#include <autoshard/%s/%s.hpp>\nint main() { return 0; }\n' "$area" "$area" > "$work/area_$area.cpp"
    read -r w c <<< "$(median3 "$work/area_$area.cpp")"
    row "<autoshard/$area/$area.hpp>" "$w" "$c"
    if [[ $area == gloo ]]; then  # the TCP store compiled elsewhere (gloo/tcp_store_impl.hpp)
      read -r w c <<< "$(median3 "$work/area_$area.cpp" -DAUTOSHARD_TCP_STORE_SEPARATE)"
      row "  ... with TCP_STORE_SEPARATE" "$w" "$c"
    fi
  done
fi
