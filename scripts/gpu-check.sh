#!/usr/bin/env bash
# gpu-check.sh — the one entry point for GPU work on the device machine.
#
# Two phases, because the device machine has no Rust toolchain:
#
#   scripts/gpu-check.sh build     (here, with cargo; no GPU needed)
#       Builds the release `gpumem` CLI and the release test binaries of crate gpumem
#       (`cargo test --release --no-run --message-format=json`, executables read from cargo's
#       JSON), keeps the integration tests whose source holds tests ignored as "needs a CUDA
#       device" (the house convention for GPU tests), strips everything and copies it,
#       with the shipped traces, into the git-ignored folder carry/:
#           carry/gpumem  carry/tests/<test-target>  carry/traces/...
#
#   scripts/gpu-check.sh run [GROUP...]   (on the device machine, from the repository root)
#       GROUPs (default: all, in this order): info baselines tests bench pinned replay multigpu — e.g.
#       `run replay` in a second device call when one call's 10 minutes are not enough.
#       Group `lazy` runs only when named: every shipped single-device trace replayed with
#       --device cuda --canary --allocator paged-lazy,torch under --lazy-conf placement=pages
#       and grow_ahead=0.0156, into lazy.jsonl (the input of scripts/fit/fit-cost-model.py, with
#       replay.jsonl).
#       Group `tight` runs only when named: every shipped single-device trace replayed with
#       --device cuda --canary --allocator paged-lazy at the smallest capacity the simulated
#       replay needs (found here with --min-capacity), so that growths are cut into small
#       handles and out-of-memory releases run on the real driver; into tight.jsonl, each
#       line with the simulated replay at the same capacity beside the real one.
#       Group `heldout` runs only when named: scripts/bench/heldout-check.sh (traces of workloads
#       no policy was tuned on, recorded, replayed on cuda; the plug-in on two held-out
#       models), packed into heldout.tar.gz (~4 min).
#       Group `torch` runs only when named, in a call of its own (`run torch`, ~7 min):
#       scripts/bench/torch-compare.py with libgpumem_torch.so as PyTorch's allocator (smoke check,
#       1,000-step soak, native vs expandable_segments vs gpumem paged-lazy on four workloads); its
#       files are packed into torch.tar.gz.
#       Runs, each step under its own time limit, continuing after a failing step:
#         1. gpumem info (table, and --json), gpumem inspect, gpumem vmm, gpumem watch --once
#            (text and --json, into the log)
#         1b. scripts/bench/baselines/run.sh: gpumem's C++/CUDA baseline programs, built with nvcc
#            from the repository (cudaMalloc, cuMemAlloc, cudaMallocAsync, VMM calls by size,
#            host allocation, copies; PyTorch's c10 allocator when torch imports), into
#            baselines.jsonl and the table baselines.md (with bench alloc's speedups against
#            the faster baseline once step 3 has run)
#         2. every GPU test binary with --ignored --test-threads 1
#         3. gpumem bench alloc --device cuda (strategies vs cuMemAlloc and cuMemAllocAsync)
#         4. scripts/bench/pinned-bench.sh (pinned host memory: transfers, allocation, advise)
#         5. gpumem replay of every shipped trace with --device cuda --canary, all strategies,
#            smallest trace first, until the time budget runs out (less GPU_CHECK_MULTIGPU_S,
#            default 240, kept for step 6 when it will run)
#         6. multigpu (2 devices or more; else one line "skipped: 1 device"): the two-device
#            GPU tests, gpumem bench transfer --device all (host<->device per device, peer
#            copies with % of the cuMemcpyPeerAsync baseline and % of link), the 90 % target
#            and the peer-copy byte checks as lines of their own, and gpumem replay
#            traces/multigpu/two_devices.jsonl --device all --canary (device N's events on
#            cuda:N); PyTorch with the plug-in (scripts/bench/torch-multigpu.py: a model on cuda:1, a
#            tensor moved between the GPUs, each pool back to its start) and its recorded trace
#            replayed with --device all; their JSON goes into replay.jsonl, one line each with
#            a "step" key
#       Writes under $OUT if set (else carry/out): gpu-check.log (everything),
#       info.json, baselines.jsonl, baselines.md, replay.jsonl, bench-alloc.json, pinned.tar.gz,
#       summary.txt — few files,
#       since the device tool brings back at most 8. Prints a summary table (step, status, seconds) last.
#       Exit status 0 only if no step failed.
#
# Device tool call (the lead's), after `scripts/gpu-check.sh build` here:
#   run(command="scripts/gpu-check.sh run", carry=["carry"], timeout_s=600)
#
# Tunables (environment): GPU_CHECK_BUDGET_S (default 500: steps that would start later are
# skipped), GPU_CHECK_BENCH_MS (per-measurement time of bench alloc, default 100),
# GPU_CHECK_REPLAY_TIMEOUT_S (per trace, default 150), GPU_CHECK_TEST_TIMEOUT_S (per test
# binary, default 180).
set -u
set -o pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
CARRY="$ROOT/carry"

die() {
  echo "gpu-check build: $*" >&2
  exit 1
}

build() {
  local target=${CARGO_TARGET_DIR:-target}
  echo "== cargo build --release -p gpumem-cli"
  cargo build --release -p gpumem-cli || die "cargo build failed"
  rm -rf "$CARRY"
  mkdir -p "$CARRY/tests" "$CARRY/traces" || die "cannot create $CARRY"
  strip -o "$CARRY/gpumem" "$target/release/gpumem" || die "strip failed"
  echo "== cargo test --release -p gpumem --no-run"
  local json
  json=$(mktemp)
  cargo test --release -p gpumem --no-run --message-format=json >"$json" ||
    die "cargo test --no-run failed (compiler messages are in $json)"
  local list
  list=$(python3 -c '
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []):
        # Integration tests whose source holds GPU tests (ignored as "needs a CUDA device");
        # a test made of main.rs and modules is searched in its whole directory.
        path = t["src_path"]
        files = [path]
        if os.path.basename(path) == "main.rs":
            d = os.path.dirname(path)
            files = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".rs")]
        src = ""
        for f in files:
            try:
                src += open(f).read()
            except OSError:
                pass
        if "needs a CUDA device" in src:
            print(t["name"], m["executable"])
' "$json") || die "cannot read cargo's JSON"
  rm -f "$json"
  local name exe n carried=0
  while read -r name exe; do
    [ -n "$name" ] || continue
    n=$("$exe" --ignored --list 2>/dev/null | grep -c ': test$')
    if [ "${n:-0}" -gt 0 ]; then
      strip -o "$CARRY/tests/$name" "$exe" || die "strip $exe failed"
      echo "   carried $name ($n GPU tests)"
      carried=$((carried + 1))
    fi
  done <<<"$list"
  [ "$carried" -gt 0 ] || die "no test binary with ignored (GPU) tests found"
  cp -r traces/. "$CARRY/traces/" || die "cannot copy traces"
  # The PyTorch plug-in (issue 13): the library, the Python module and the comparison script.
  echo "== cargo build --release -p gpumem-torch"
  cargo build --release -p gpumem-torch || die "cargo build -p gpumem-torch failed"
  mkdir -p "$CARRY/torch" || die "cannot create $CARRY/torch"
  strip -o "$CARRY/torch/libgpumem_torch.so" "$target/release/libgpumem_torch.so" || die "strip libgpumem_torch.so failed"
  cp python/gpumem_torch.py scripts/bench/torch-compare.py scripts/record/gpt2_workload.py scripts/record/heldout_models.py "$CARRY/torch/" || die "cannot copy the plug-in's Python files"
  # The baseline programs (scripts/bench/baselines/) are built by nvcc on the device machine.
  echo "== carry/ holds $(du -sh "$CARRY" | cut -f1):"
  find "$CARRY" -type f | sort | sed 's/^/   /'
}

# ---------------------------------------------------------------- run

OUTDIR=${OUT:-$CARRY/out}
LOG="$OUTDIR/gpu-check.log"
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-500}
STEPS=()
STATUS=()
SECS=()

log() { echo "$*" | tee -a "$LOG"; }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with output appended to the log.
step() {
  local name=$1 limit=$2
  shift 2
  local now=$(( $(date +%s) - START ))
  if [ "$now" -ge "$BUDGET" ]; then
    STEPS+=("$name"); STATUS+=("SKIP (time)"); SECS+=(0)
    log "== $name: skipped, ${now}s used of the ${BUDGET}s budget"
    return
  fi
  local left=$(( BUDGET - now + 60 ))
  [ "$limit" -gt "$left" ] && limit=$left
  log "== $name (limit ${limit}s): $*"
  local t0 rc
  t0=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then
    # timeout runs programs, not shell functions: run the (exported) function in a child bash.
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >>"$LOG" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  fi
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local st=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then st="FAIL (timeout)"; elif [ "$rc" -eq 3 ]; then st="FAIL (canary errors)"; elif [ "$rc" -ne 0 ]; then st="FAIL (rc $rc)"; fi
  STEPS+=("$name"); STATUS+=("$st"); SECS+=("$dt")
  log "== $name: $st in ${dt}s"
}

# Runs the CLI with stdout to FILE (JSON) and stderr to the log.
json_to() {
  local file=$1
  shift
  "$@" >"$file"
}

# multigpu_json STEP FILE COMMAND...: runs COMMAND (JSON on stdout), appends
# {"step": STEP, "rc": RC, "report": JSON} to FILE; rc 3 when the JSON shows canary errors
# (replay) or a failed peer-copy check.
multigpu_json() {
  local name=$1 file=$2
  shift 2
  local tmp
  tmp=$(mktemp)
  "$@" >"$tmp"
  local rc=$?
  printf '{"step": "%s", "rc": %d, "report": ' "$name" "$rc" >>"$file"
  if [ -s "$tmp" ]; then tr -d '\n' <"$tmp" >>"$file"; else printf 'null' >>"$file"; fi
  printf '}\n' >>"$file"
  if grep -Eq '"canary_errors": *[1-9]|"mismatched_bytes": *[1-9]|"damaged_guard_bytes": *[1-9]|"damaged_source_bytes": *[1-9]' "$tmp"; then
    echo "$name: wrong bytes (canary or peer-copy check)"
    rm -f "$tmp"
    return 3
  fi
  rm -f "$tmp"
  return "$rc"
}

# replay_one TRACE LIMIT_S [OUT ALLOCATORS LAZY_CONF]: one canary replay under its own time
# limit, so that a line with its exit status (124: timed out) lands in OUT (default
# replay.jsonl; ALLOCATORS default all, LAZY_CONF default none) even when it is cut short.
replay_one() {
  local trace=$1 limit=$2 out=${3:-$OUTDIR/replay.jsonl} allocators=${4:-all} lazy=${5:-}
  local tmp
  tmp=$(mktemp)
  local extra=()
  [ -n "$lazy" ] && extra=(--lazy-conf "$lazy")
  timeout --kill-after=10 "$limit" "$CARRY/gpumem" replay "$trace" --device cuda --canary --allocator "$allocators" "${extra[@]}" --json >"$tmp"
  local rc=$?
  printf '{"trace": "%s", "rc": %d, "lazy_conf": "%s", "report": ' "$(basename "$trace")" "$rc" "$lazy" >>"$out"
  if [ -s "$tmp" ]; then tr -d '\n' <"$tmp" >>"$out"; else printf 'null' >>"$out"; fi
  printf '}\n' >>"$out"
  # A damaged canary means two live blocks overlapped: a failure even if the replay ended.
  if grep -Eq '"canary_errors": *[1-9]' "$tmp"; then
    echo "canary errors in $(basename "$trace")"
    rm -f "$tmp"
    return 3
  fi
  rm -f "$tmp"
  return "$rc"
}

# tight_one TRACE LIMIT: paged-lazy at the smallest capacity its simulated replay completes
# with (every larger one too), simulated and on cuda, one line of tight.jsonl.
tight_one() {
  local trace=$1 limit=$2 cap sim real rc
  cap=$("$CARRY/gpumem" replay "$trace" --allocator paged-lazy --min-capacity --no-plan --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["allocators"][0]["min_capacity_all_larger_bytes"])') || return 4
  sim=$(mktemp); real=$(mktemp)
  "$CARRY/gpumem" replay "$trace" --allocator paged-lazy --capacity "$cap" --no-plan --json >"$sim"
  timeout --kill-after=10 "$limit" "$CARRY/gpumem" replay "$trace" --device cuda --canary \
    --allocator paged-lazy --capacity "$cap" --no-plan --json >"$real"
  rc=$?
  printf '{"trace": "%s", "rc": %d, "capacity_bytes": %s, "sim": ' "$(basename "$trace")" "$rc" "$cap" >>"$OUTDIR/tight.jsonl"
  if [ -s "$sim" ]; then tr -d '\n' <"$sim" >>"$OUTDIR/tight.jsonl"; else printf 'null' >>"$OUTDIR/tight.jsonl"; fi
  printf ', "real": ' >>"$OUTDIR/tight.jsonl"
  if [ -s "$real" ]; then tr -d '\n' <"$real" >>"$OUTDIR/tight.jsonl"; else printf 'null' >>"$OUTDIR/tight.jsonl"; fi
  printf '}\n' >>"$OUTDIR/tight.jsonl"
  if grep -Eq '"canary_errors": *[1-9]' "$real"; then
    echo "canary errors in $(basename "$trace")"; rc=3
  elif grep -Eq '"oom_count": *[1-9]' "$real"; then
    echo "out of memory at $cap bytes in $(basename "$trace")"; rc=5
  fi
  rm -f "$sim" "$real"
  return "$rc"
}

# want GROUP: whether this run includes a step group (all groups when none were named).
want() {
  [ "${#GROUPS_WANTED[@]}" -eq 0 ] && return 0
  local g
  for g in "${GROUPS_WANTED[@]}"; do [ "$g" = "$1" ] && return 0; done
  return 1
}

run() {
  GROUPS_WANTED=("$@")
  local g
  for g in "${GROUPS_WANTED[@]}"; do
    case "$g" in info | baselines | anchors | tests | bench | pinned | replay | lazy | tight | torch | heldout | multigpu) ;; *) echo "unknown step group: $g" >&2; exit 2 ;; esac
  done
  export CARRY OUTDIR
  export -f json_to replay_one tight_one multigpu_json
  mkdir -p "$OUTDIR"
  : >"$LOG"
  : >"$OUTDIR/replay.jsonl"
  if [ ! -x "$CARRY/gpumem" ]; then
    log "carry/gpumem is missing: run 'scripts/gpu-check.sh build' where cargo is, and carry the folder carry/"
    exit 2
  fi
  log "gpu-check on $(hostname) at $(date -u +%FT%TZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >>"$LOG" 2>&1

  # 1. info
  if want info; then
    step "info" 60 "$CARRY/gpumem" info --device all
    step "info --json" 60 json_to "$OUTDIR/info.json" "$CARRY/gpumem" info --device all --json
    step "inspect" 60 "$CARRY/gpumem" inspect --device cuda
    step "vmm" 60 "$CARRY/gpumem" vmm --device cuda
    # report: one NVML sample, as text and JSON (no terminal needed).
    step "watch --once" 60 "$CARRY/gpumem" watch --once
    step "watch --once --json" 60 "$CARRY/gpumem" watch --once --json
  fi

  # 1b. gpumem's own baseline programs (C++/CUDA, scripts/bench/baselines/), built here with nvcc and
  # run in the same call as gpumem's benchmarks; `anchors` is the group's former name.
  if want baselines || want anchors; then
    step "baselines (nvcc)" 300 "$ROOT/scripts/bench/baselines/run.sh" "$OUTDIR/baselines.jsonl" "$OUTDIR/baselines.md"
  fi

  # 2. GPU tests

  local t
  for t in "$CARRY"/tests/*; do
    want tests || break
    [ -x "$t" ] || continue
    step "test $(basename "$t")" "${GPU_CHECK_TEST_TIMEOUT_S:-180}" "$t" --ignored --test-threads 1
  done

  # 3. allocation benchmark: table into the log, JSON into bench-alloc.json
  want bench && step "bench alloc" 240 json_to "$OUTDIR/bench-alloc.json" "$CARRY/gpumem" bench alloc --device cuda \
    --time-ms "${GPU_CHECK_BENCH_MS:-100}" --json
  if want bench && [ -s "$OUTDIR/bench-alloc.json" ] && command -v python3 >/dev/null; then
    python3 - "$OUTDIR/bench-alloc.json" >>"$LOG" 2>&1 <<'PY'
import json, sys
for dev in json.load(open(sys.argv[1])):
    print("bench alloc on", dev["device"])
    for r in dev["rows"]:
        case = r["case"] if isinstance(r["case"], str) else "%d B" % r["case"]["fixed"]
        f = lambda x: "-" if x is None else "%.1f" % x
        print("  %-16s %-12s x%-3d median %9.0f ns  p99 %9.0f ns  %12.0f pairs/s  x%s vs cuMemAlloc  x%s vs async" % (
            r["backend"], case, r["threads"], r["median_ns"], r["p99_ns"], r["pairs_per_s"],
            f(r["speedup_vs_cumemalloc"]), f(r["speedup_vs_cumemallocasync"])))
    for e in dev["errors"]:
        print("  error:", e)
PY
  fi
  # Every speedup against the faster baseline of this run (Rust or C++), into baselines.md.
  if [ -s "$OUTDIR/baselines.jsonl" ] && [ -s "$OUTDIR/bench-alloc.json" ] && command -v python3 >/dev/null; then
    python3 "$ROOT/scripts/bench/baselines/table.py" "$OUTDIR/baselines.jsonl" "$OUTDIR/bench-alloc.json" \
      >"$OUTDIR/baselines.md" 2>>"$LOG" && cat "$OUTDIR/baselines.md" >>"$LOG"
  fi

  # 4. pinned host memory: scripts/bench/pinned-bench.sh (transfer, pinned allocation, advise); its
  #    files are packed into one archive, since the device tool brings back at most 8 files.
  #    (Its ignored CUDA tests already ran in step 2: the pinned test binary is carried like cuda.)
  if ! want pinned; then
    :
  elif [ -x "$ROOT/scripts/bench/pinned-bench.sh" ]; then
    step "pinned benchmarks" 200 "$ROOT/scripts/bench/pinned-bench.sh" "$CARRY/gpumem" "$OUTDIR/pinned"
    if [ -d "$OUTDIR/pinned" ]; then
      tar -C "$OUTDIR" -czf "$OUTDIR/pinned.tar.gz" pinned && rm -rf "$OUTDIR/pinned"
    fi
  else
    STEPS+=("pinned benchmarks"); STATUS+=("SKIP (no scripts/bench/pinned-bench.sh)"); SECS+=(0)
  fi

  # 4b. PyTorch with gpumem as its allocator (only when named: it needs a call of its own)
  local g2 torch_named=0
  for g2 in "${GROUPS_WANTED[@]}"; do [ "$g2" = torch ] && torch_named=1; done
  if [ "$torch_named" -eq 1 ]; then
    if [ -f "$CARRY/torch/libgpumem_torch.so" ] && command -v python3 >/dev/null; then
      step "torch-compare" 560 python3 "$CARRY/torch/torch-compare.py" --lib "$CARRY/torch/libgpumem_torch.so" \
        --out "$OUTDIR/torch" --smoke --soak --configs native,expandable,lazy --warmup 3 --steps 12 \
        --budget-s "${GPU_CHECK_TORCH_BUDGET_S:-420}"
      if [ -d "$OUTDIR/torch" ]; then
        tar -C "$OUTDIR" -czf "$OUTDIR/torch.tar.gz" torch && rm -rf "$OUTDIR/torch"
      fi
    else
      STEPS+=("torch-compare"); STATUS+=("SKIP (no carry/torch or python3)"); SECS+=(0)
    fi
  fi

  # Devices visible (for the multigpu group): gpumem's own count, so CUDA_VISIBLE_DEVICES holds.
  local ndev=0
  if want multigpu; then
    ndev=$("$CARRY/gpumem" info --device all --json 2>/dev/null | grep -c '"ordinal":')
  fi

  # 5. replay every shipped trace on the GPU, every strategy, with canaries; smallest first,
  #    last because they take the longest (the time budget skips what does not fit; with two
  #    devices, GPU_CHECK_MULTIGPU_S of it is kept for the multigpu group)
  local tr
  local rlimit=${GPU_CHECK_REPLAY_TIMEOUT_S:-150}
  local full_budget=$BUDGET
  if want multigpu && [ "${ndev:-0}" -ge 2 ]; then BUDGET=$((BUDGET - ${GPU_CHECK_MULTIGPU_S:-240})); fi
  while IFS= read -r tr; do
    want replay || break
    step "replay $(basename "$tr")" $((rlimit + 20)) replay_one "$tr" "$rlimit"
  done < <(find "$CARRY/traces" \( -name '*.pickle.gz' -o -name '*.jsonl' -o -name '*.csv' \) -printf '%s %p\n' |
    sort -n | cut -d' ' -f2-)
  BUDGET=$full_budget

  # 5b. `lazy` (only when named): paged-lazy's other settings against torch on every shipped
  #     single-device trace, with canaries, into lazy.jsonl: the page placement (which unmaps
  #     and remaps idle handles with few mappings live: data for the cost model's unmap and
  #     release factors, scripts/fit/fit-cost-model.py) and grow_ahead=0.0156 (the call-first
  #     setting of the default placement).
  if [ "${#GROUPS_WANTED[@]}" -gt 0 ] && want lazy; then
    : >"$OUTDIR/lazy.jsonl"
    local conf
    for conf in placement=pages grow_ahead=0.0156; do
      while IFS= read -r tr; do
        step "lazy $conf $(basename "$tr")" $((rlimit + 20)) replay_one "$tr" "$rlimit" "$OUTDIR/lazy.jsonl" paged-lazy,torch "$conf"
      done < <(find "$CARRY/traces" -path '*multigpu*' -prune -o -name '*.pickle.gz' -printf '%s %p\n' |
        sort -n | cut -d' ' -f2-)
    done
  fi

  # 5c. `tight` (only when named): paged-lazy at its smallest simulated capacity, on cuda.
  if [ "${#GROUPS_WANTED[@]}" -gt 0 ] && want tight; then
    : >"$OUTDIR/tight.jsonl"
    while IFS= read -r tr; do
      step "tight $(basename "$tr")" $((rlimit + 60)) tight_one "$tr" "$rlimit"
    done < <(find "$CARRY/traces" -path '*multigpu*' -prune -o -name '*.pickle.gz' -printf '%s %p\n' |
      sort -n | cut -d' ' -f2-)
  fi

  # 5d. `heldout` (only when named): scripts/bench/heldout-check.sh (records the held-out
  #     workloads' traces, replays them on cuda, the plug-in on held-out models) into
  #     heldout.tar.gz.
  if [ "${#GROUPS_WANTED[@]}" -gt 0 ] && want heldout; then
    step "heldout" 560 "$ROOT/scripts/bench/heldout-check.sh" "$OUTDIR"
  fi

  # 6. two devices: peer copies, peer bandwidth, a multi-device trace on both GPUs. Figures
  #    and checks go to replay.jsonl (lines with a "step" key; the device tool brings back 8
  #    files at most); the 90 % target and the byte checks are lines of their own in the summary.
  if ! want multigpu; then
    :
  elif [ "${ndev:-0}" -lt 2 ]; then
    STEPS+=("multigpu"); STATUS+=("SKIP (skipped: ${ndev:-0} device)"); SECS+=(0)
    log "== multigpu: skipped: ${ndev:-0} device"
  else
    local cudatests="$CARRY/tests/cuda"
    if [ -x "$cudatests" ]; then
      step "multigpu tests" 240 "$cudatests" --ignored --test-threads 1 multigpu vmm_arena peer_access
    else
      STEPS+=("multigpu tests"); STATUS+=("FAIL (no carry/tests/cuda)"); SECS+=(0)
    fi
    step "multigpu bench transfer --device all" 300 multigpu_json "bench transfer --device all" "$OUTDIR/replay.jsonl" \
      "$CARRY/gpumem" bench transfer --device all --sizes "${GPU_CHECK_MULTIGPU_SIZES:-1MiB,64MiB,256MiB,1GiB}" \
      --kinds pageable,pinned,staged --repeats 5 --no-cache --json
    local mt="$CARRY/traces/multigpu/two_devices.jsonl"
    if [ -f "$mt" ]; then
      step "multigpu replay two_devices --device all" 200 multigpu_json "replay --device all" "$OUTDIR/replay.jsonl" \
        "$CARRY/gpumem" replay "$mt" --device all --canary --allocator all --json
    else
      STEPS+=("multigpu replay"); STATUS+=("FAIL (no traces/multigpu/two_devices.jsonl)"); SECS+=(0)
    fi
    # PyTorch with the gpumem plug-in on both GPUs (issue 15, item 5), and its recorded trace
    # replayed with --device all.
    if [ -f "$CARRY/torch/libgpumem_torch.so" ] && python3 -c 'import torch' >/dev/null 2>&1; then
      local tt
      tt=$(mktemp --suffix=.jsonl)
      step "multigpu torch: model on cuda:1, tensor moved" 240 multigpu_json "torch two GPUs" "$OUTDIR/replay.jsonl" \
        python3 "$ROOT/scripts/bench/torch-multigpu.py" --lib "$CARRY/torch/libgpumem_torch.so" --trace "$tt"
      if [ -s "$tt" ]; then
        step "multigpu replay torch trace --device all" 200 multigpu_json "replay torch trace --device all" "$OUTDIR/replay.jsonl" \
          "$CARRY/gpumem" replay "$tt" --device all --canary --allocator all --json
      fi
      rm -f "$tt"
    else
      STEPS+=("multigpu torch"); STATUS+=("SKIP (no carry/torch or no torch)"); SECS+=(0)
    fi
    # The target and the figures, as summary lines and into the log.
    if command -v python3 >/dev/null && [ -s "$OUTDIR/replay.jsonl" ]; then
      local lines
      lines=$(python3 - "$OUTDIR/replay.jsonl" 2>>"$LOG" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    r = m.get("report")
    if not r or m.get("step") != "bench transfer --device all":
        continue
    for d in r.get("devices", []):
        best = {}
        for x in d["results"]:
            k = (x["kind"], x["direction"])
            best[k] = max(best.get(k, 0), x["gbps"])
        print("INFO\tcuda:%d host<->device best GB/s: %s" % (d["ordinal"], ", ".join(
            "%s %s %.1f" % (k[0], k[1], v) for k, v in sorted(best.items()))))
    for p in r.get("peer", []):
        a, b = p["devices"]
        big = max((x["bytes"] for x in p["rows"]), default=0)
        for x in p["rows"]:
            if x["bytes"] == big:
                print("INFO\tpeer %d<->%d %s %s %s: %.1f GB/s, %s of baseline, %s of link" % (
                    a, b, x["method"], x["memory"], x["direction"], x["gbps"],
                    "-" if x["pct_of_baseline"] is None else "%.1f %%" % x["pct_of_baseline"],
                    "-" if x["pct_of_link"] is None else "%.1f %%" % x["pct_of_link"]))
        print("INFO\tlink %d<->%d: %s" % (a, b, p["link"]["source"]))
        pct = p.get("pool_min_pct_of_baseline")
        st = "FAIL" if pct is None or pct < 90 else "ok"
        print("STEP\tmultigpu peer %d<->%d pool >= 90%% baseline\t%s (%s)" % (
            a, b, st, "n/a" if pct is None else "%.1f %%" % pct))
        bad = sum(1 for c in p["checks"] if c["check"]["mismatched_bytes"] or c["check"]["damaged_guard_bytes"] or c["check"]["damaged_source_bytes"])
        grants = sorted({c.get("grant", "?") for c in p["checks"] if c.get("vmm")})
        print("STEP\tmultigpu peer %d<->%d byte checks\t%s (%d of %d passed; VMM by %s)" % (
            a, b, "FAIL" if bad or not p["checks"] else "ok", len(p["checks"]) - bad, len(p["checks"]),
            "/".join(grants) or "-"))
PY
)
      local kind rest st
      while IFS=$'\t' read -r kind rest st; do
        case "$kind" in
          INFO) log "   $rest" ;;
          STEP) STEPS+=("$rest"); STATUS+=("$st"); SECS+=(0); log "== $rest: $st" ;;
        esac
      done <<<"$lines"
    fi
  fi

  # Summary, last.
  local failed=0 i
  for i in "${!STATUS[@]}"; do
    case "${STATUS[$i]}" in FAIL*) failed=$((failed + 1)) ;; esac
  done
  {
    echo
    echo "gpu-check summary ($(( $(date +%s) - START ))s in all; logs and JSON in $OUTDIR)"
    printf '%-44s %-34s %6s\n' "step" "status" "s"
    for i in "${!STEPS[@]}"; do
      printf '%-44s %-34s %6s\n' "${STEPS[$i]}" "${STATUS[$i]}" "${SECS[$i]}"
    done
    echo "$failed step(s) failed"
  } | tee "$OUTDIR/summary.txt" | tee -a "$LOG"
  [ "$failed" -eq 0 ]
}

case "${1:-}" in
  build) build ;;
  run)
    shift
    run "$@"
    ;;
  *)
    echo "usage: scripts/gpu-check.sh build   # here: release CLI + GPU test binaries into carry/" >&2
    echo "       scripts/gpu-check.sh run [GROUP...]  # on the device machine; GROUPs: info baselines tests bench pinned replay multigpu (default all), lazy and torch (only when named)" >&2
    exit 2
    ;;
esac
