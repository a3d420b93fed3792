#!/usr/bin/env bash
# One device call: GPU tests, the cold/warm restart check, a store warmed on a CPU machine
# (carried as .gpu_store), the demo, and the benchmark suite. Logs and JSON go to $OUT.
#   PARTS   which of "tests restart demo bench" to run (default: all four); a whole session
#           can outlast one call's 10 minutes, so split it: PARTS="tests restart demo", then
#           PARTS=bench
#   FAMILIES  benchmark families (default "--family pointwise --family host"; "--family all")
#   BENCH_K   only benchmark cases whose name contains this
#   TESTS     the GPU tests to run (default tests/gpu)
#   SWEEP     part "sweep": a plan of benchmarks/sweeps/ to time (benchmarks/sweep.py)
#   NCU_CASES part "ncu": cases to profile with Nsight Compute, ours and torch.compile's, and
#           where our first kernel's warps stall (benchmarks/ncu_stalls.py)
#   MODELS  part "models": python -m benchmarks.models over these models (default all three:
#           about 4-6 minutes on an H100; "gpt2" or "resnet18" alone fits any call), results
#           in $OUT/models-<device>.json/.md; MODEL_ARGS adds options (e.g.
#           "--contenders eager,inductor,fusion_cache,fusion_cache_graphs")
#           part "regions": python -m benchmarks.host_region, one region call's host time
#   BASE    part "base": a git revision whose fusions the same FAMILIES and BENCH_K time in
#           this call, from a worktree of it, for a same-run baseline (log: base_bench.log;
#           its JSON stays out of $OUT)
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
python3 -m compileall -q /tmp/site >/dev/null 2>&1  # an installed package has its .pyc files
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.txt"
python3 -c "import torch, cuda.bindings; print(torch.__version__, torch.version.cuda)" | tee -a "$OUT/device.txt"
FAMILIES=${FAMILIES:-"--family pointwise --family host"}
PARTS=" ${PARTS:-tests restart demo bench} "

if [[ $PARTS == *" tests "* ]]; then
  echo "== GPU tests"
  FUSION_CACHE_DISABLE_FALLBACK=1 timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
    ${TESTS:-tests/gpu} 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^tests/gpu/test_frontends_gpu" \
    | tail -40
fi

if [[ $PARTS == *" restart "* ]]; then
  echo "== restart: cold then warm on a fresh store"
  export FUSION_CACHE_DIR=/tmp/fc_restart; rm -rf $FUSION_CACHE_DIR
  python3 examples/restart_timing.py | tee "$OUT/restart.jsonl"
  RESTART_PROFILE=1 python3 examples/restart_timing.py 2>"$OUT/warm_profile.txt" | tee -a "$OUT/restart.jsonl"
  echo "== a store warmed with 'fusion-cache warmup --target h100' on a CPU-only machine"
  cp -r .gpu_store /tmp/carried && FUSION_CACHE_DIR=/tmp/carried python3 examples/restart_timing.py \
    | tee -a "$OUT/restart.jsonl"
  unset FUSION_CACHE_DIR
fi

if [[ $PARTS == *" demo "* ]]; then
  echo "== demo"
  FUSION_CACHE_DIR=/tmp/fc_demo python3 -m fusion_cache.cli demo | tail -4
fi

if [[ $PARTS == *" bench "* ]]; then
  echo "== benchmarks"
  for f in benchmarks/results/*.json; do  # the results to merge into, not the sweeps'
    [[ $f == */sweep-* ]] || cp "$f" "$OUT/"
  done
  FUSION_CACHE_DIR=/tmp/fc_bench timeout 560 python3 -m benchmarks.run $FAMILIES \
    ${BENCH_K:+-k $BENCH_K} --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^\[" | tail -150
fi

if [[ $PARTS == *" models "* ]]; then
  echo "== models: training steps, eager / inductor / fusion_cache"
  timeout 590 python3 -m benchmarks.models --models ${MODELS:-gpt2,llama,resnet18} $MODEL_ARGS \
    --out "$OUT" 2>&1 | tee "$OUT/models.log" | tail -80
fi

if [[ $PARTS == *" regions "* ]]; then
  echo "== host time of one region call"
  FUSION_CACHE_DIR=/tmp/fc_regions timeout 300 python3 -m benchmarks.host_region \
    --json "$OUT/host-region.json" 2>&1 | tee "$OUT/host_region.log"
fi

if [[ $PARTS == *" base "* ]]; then
  echo "== benchmarks of ${BASE:?part base needs BASE, a git revision}"
  rm -rf /tmp/fc_base_tree && git worktree add -q --detach /tmp/fc_base_tree "$BASE" || exit 1
  mkdir -p /tmp/fc_base_out
  (cd /tmp/fc_base_tree && PYTHONPATH=/tmp/site:/tmp/fc_base_tree FUSION_CACHE_DIR=/tmp/fc_base \
    timeout 560 python3 -m benchmarks.run $FAMILIES ${BENCH_K:+-k $BENCH_K} --out /tmp/fc_base_out) \
    2>&1 | tee "$OUT/base_bench.log" | grep -v "^\[" | tail -150
  git worktree remove --force /tmp/fc_base_tree
fi

if [[ $PARTS == *" ncu "* ]]; then
  echo "== Nsight Compute"
  sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
  stalls='--section SourceCounters --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  for c in $NCU_CASES; do
    FUSION_CACHE_DIR=/tmp/fc_ncu timeout 120 ncu --clock-control none $sections -k regex:fc_ \
      --launch-skip 2 --launch-count 2 python3 -m benchmarks.profile_case $c >> "$OUT/ncu.txt" 2>&1
    # where the first kernel's warps wait, down to the SASS instruction
    FUSION_CACHE_DIR=/tmp/fc_ncu timeout 120 ncu --clock-control none $stalls -k regex:fc_ \
      --launch-skip 2 --launch-count 1 -o "$OUT/ncu-$c" -f python3 -m benchmarks.profile_case $c \
      >/dev/null 2>&1 && python3 -m benchmarks.ncu_stalls "$OUT/ncu-$c.ncu-rep" >> "$OUT/ncu-stalls.txt"
    timeout 120 ncu --clock-control none $sections -k regex:triton --launch-skip 12 \
      --launch-count 1 python3 -m benchmarks.profile_case $c --compile --calls 16 >> "$OUT/ncu.txt" 2>&1
  done
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occ" "$OUT/ncu.txt" | head -150
  cat "$OUT/ncu-stalls.txt" 2>/dev/null
fi

if [[ $PARTS == *" sweep "* ]]; then
  echo "== sweep $SWEEP"
  FUSION_CACHE_DIR=/tmp/fc_sweep timeout 500 python3 -m benchmarks.sweep "benchmarks/sweeps/$SWEEP.json" \
    --out "$OUT" --jobs 14 2>&1 | tee "$OUT/sweep.log" | grep -v Warning | tail -400
fi
