#!/usr/bin/env bash
# Proof run for the all-reduce probe (issue 8) on one host with 2+ NVIDIA GPUs, in one batch:
#   1. GPU facts: nvidia-smi -q -x (fabric state included), topo -m, nvlink -s, query CSV (raw + parsed)
#   2. nccl-tests' all_reduce_perf, built here by an outside script against the NCCL that PyTorch loads
#   3. our probe (twice, then once with CUDA graphs) and all_reduce_perf over the same sweep;
#      busbw within +-3% at 1 and 4 GiB
#   4. the transport lines of both, plus forced SHM and Socket runs that the verdict must fail
#   5. a 2-"node" run of the probe (one GPU per process group, CUDA_VISIBLE_DEVICES)
#   6. memory and utilization balance under a balanced load (both GPUs), then one GPU busy
# It changes no GPU setting (no clocks, power, MIG, persistence) and keeps NVLink multicast off.
#
# Usage, from the repository root:  bench/gpu/proof_run.sh OUT_DIR
#   NCCL_TESTS_SRC    nccl-tests source tree (default .cache/nccl-tests; not part of this repository)
#   NCCL_TESTS_BUILD  executable that builds all_reduce_perf: SRC NCCL_HOME OUT_DIR SM_CAPABILITY
#                     (default .cache/build-nccl-tests; not part of this repository)
#   PROOF_PYTHON    interpreter with torch (default python3)
#   PROOF_CPU_SMOKE=1  exercise every step on a CPU-only machine (gloo, small sizes); GPU steps fail soft
# Results: OUT_DIR/summary.json, summary.md, run.log, captures.tgz.
set -uo pipefail

OUT_DIR=${1:?usage: bench/gpu/proof_run.sh OUT_DIR}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PROOF_PYTHON:-python3}
NCCL_TESTS_SRC=${NCCL_TESTS_SRC:-$REPO/.cache/nccl-tests}
NCCL_TESTS_BUILD=${NCCL_TESTS_BUILD:-$REPO/.cache/build-nccl-tests}
CPU_SMOKE=${PROOF_CPU_SMOKE:-0}
PROBE=$REPO/roles/nccl_network/files/nccl_probe.py
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d /tmp/proof-run.XXXXXX)
CAP=$WORK/captures
mkdir -p "$CAP"
LOG=$OUT_DIR/run.log
: >"$LOG"

# NVLink multicast stays off for every process this script starts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$REPO/collections${PYTHONPATH:+:$PYTHONPATH}

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }
# step NAME TIMEOUT_S COMMAND...: run with a time bound, record rc and seconds, never abort the batch.
step() {
    local name=$1 limit=$2 began rc
    shift 2
    began=$(date +%s%N)
    log "step $name: start"
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    record "$name" "$rc" "$began"
    return 0
}
record() { # record NAME RC START_NS: one line of captures/steps.tsv
    printf '%s\t%s\t%s\n' "$1" "$2" "$((($(date +%s%N) - $3) / 1000000))" >>"$CAP/steps.tsv"
    log "step $1: rc=$2"
}
capture() { # capture FILE COMMAND...: stdout to captures/FILE, stderr to the log
    local file=$1
    shift
    timeout 60 "$@" >"$CAP/$file" 2>>"$LOG" || log "capture $file: rc=$?"
}

log "proof run in $WORK, repository $REPO, python $PY, cpu smoke $CPU_SMOKE"
printf 'step\trc\tmilliseconds\n' >"$CAP/steps.tsv"

# ---- 1. facts and versions (read-only nvidia-smi calls) ---------------------------------------
capture nvidia-smi.txt nvidia-smi
capture nvidia-smi-q.xml nvidia-smi -q -x
capture topo.txt nvidia-smi topo -m
capture nvlink-s.txt nvidia-smi nvlink -s
capture query-gpu.csv nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,utilization.gpu,compute_cap,persistence_mode,mig.mode.current --format=csv
SETTINGS_QUERY=--query-gpu=index,persistence_mode,mig.mode.current,compute_mode,power.limit,clocks.applications.graphics,clocks.applications.memory
capture settings-before.csv nvidia-smi "$SETTINGS_QUERY" --format=csv
capture nvcc-version.txt "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version
{ env | grep -E '^(NCCL|CUDA|TORCH|NVSHMEM|LD_LIBRARY_PATH|PATH)' | sort; uname -a; nproc; } >"$CAP/env.txt" 2>&1
"$PY" - >"$CAP/torch.json" 2>>"$LOG" <<'EOF'
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=torch.cuda.device_count())
    if torch.cuda.is_available():
        raw = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
        info["capability"] = "%d%d" % torch.cuda.get_device_capability(0)
        with open("/proc/self/maps") as maps:
            info["libnccl"] = next((l.split()[-1] for l in maps if "libnccl.so" in l), None)
        if not info["libnccl"]:  # the nvidia-nccl wheel PyTorch depends on
            import glob, nvidia.nccl
            info["libnccl"] = next(iter(glob.glob(nvidia.nccl.__path__[0] + "/lib/libnccl.so*")), None)
except Exception as exc:
    info["error"] = repr(exc)
print(json.dumps(info))
EOF
log "torch: $(cat "$CAP/torch.json")"
NGPU=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("gpus", 0))' "$CAP/torch.json" 2>/dev/null || echo 0)

# ---- 2. nccl-tests against PyTorch's NCCL, built in the background ----------------------------
NT_BUILD=$WORK/nccl-tests-build
NT_BIN=$NT_BUILD/all_reduce_perf
NCCL_HOME_DIR=$WORK/ncclhome
build_nccl_tests() {
    local libnccl incdir capability cxx
    libnccl=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("libnccl") or "")' "$CAP/torch.json")
    capability=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("capability") or "90")' "$CAP/torch.json")
    [ -n "$libnccl" ] || { echo "PyTorch loaded no libnccl"; return 1; }
    incdir=$(dirname "$(dirname "$libnccl")")/include
    [ -f "$incdir/nccl.h" ] || incdir=$(dirname "$(find "$(dirname "$(dirname "$(dirname "$libnccl")")")" -maxdepth 4 -name nccl.h 2>/dev/null | head -n1)")
    [ -f "$incdir/nccl.h" ] || incdir=/usr/include
    [ -f "$incdir/nccl.h" ] || { echo "no nccl.h next to $libnccl"; return 1; }
    mkdir -p "$NCCL_HOME_DIR/lib"
    ln -sfn "$incdir" "$NCCL_HOME_DIR/include"
    ln -sf "$libnccl" "$NCCL_HOME_DIR/lib/libnccl.so"
    ln -sf "$libnccl" "$NCCL_HOME_DIR/lib/libnccl.so.2"
    echo "NCCL for nccl-tests: lib $libnccl, headers $incdir ($(grep -m1 -E '#define NCCL_VERSION_CODE' "$incdir/nccl.h"))"
    # The build of nccl-tests is not part of this repository (fetched third-party
    # code is never committed, nor a recipe that builds it): the operator's own
    # script gets the source, this NCCL, the output directory and the capability.
    [ -x "$NCCL_TESTS_BUILD" ] || { echo "no nccl-tests build script at $NCCL_TESTS_BUILD"; return 1; }
    cp -r "$NCCL_TESTS_SRC" "$WORK/nccl-tests-src"
    timeout --kill-after=10 420 "$NCCL_TESTS_BUILD" "$WORK/nccl-tests-src" "$NCCL_HOME_DIR" "$NT_BUILD" "$capability"
}
if [ -d "$NCCL_TESTS_SRC/src" ]; then
    (
        began=$(date +%s%N)
        log "step build_nccl_tests: start"
        build_nccl_tests >>"$LOG" 2>&1
        record build_nccl_tests $? "$began"
    ) &
    BUILD_PID=$!
else
    log "no nccl-tests source at $NCCL_TESTS_SRC"
    BUILD_PID=
fi

# ---- probe settings ------------------------------------------------------------------------------
if [ "$CPU_SMOKE" = 1 ]; then
    PROBE_ARGS=(--backend gloo --nproc-per-node 2 --min-bytes 1M --max-bytes 4M --warmup 1 --iters 3)
    SMALL_ARGS=(--backend gloo --nproc-per-node 2 --min-bytes 1M --max-bytes 2M --warmup 1 --iters 2)
else
    PROBE_ARGS=(--backend nccl --min-bytes 1M --max-bytes 4G --factor 2 --warmup 5 --iters 20)
    SMALL_ARGS=(--backend nccl --min-bytes 1M --max-bytes 256M --factor 4 --warmup 2 --iters 5)
fi

# ---- 6. balance under real load (while nccl-tests compiles on the CPUs) -----------------------
cat >"$WORK/load.py" <<'EOF'
"""Hold memory and keep one GPU's tensor cores busy for a while (bf16 matmuls on random data)."""
import json, sys, time
import torch
gpu, seconds, hold_gib, ready = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
torch.cuda.set_device(gpu)
hold = torch.empty(int(hold_gib * 2**30), dtype=torch.uint8, device=gpu).random_()
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=gpu)
b = torch.randn_like(a)
torch.cuda.synchronize()
open(ready, "w").close()
deadline, done = time.monotonic() + seconds, 0
while time.monotonic() < deadline:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    done += 10
print(json.dumps({"gpu": gpu, "matmuls": done, "tflops": done * 2 * 8192**3 / seconds / 1e12, "hold_gib": hold_gib}))
EOF
# balance_phase NAME "GPU:GiB ..." : load the listed GPUs, sample dmon and the query loop meanwhile.
balance_phase() {
    local name=$1 spec=$2 pids=() item gpu gib waited
    rm -f "$WORK"/ready-*
    for item in $spec; do
        gpu=${item%%:*} gib=${item##*:}
        timeout 90 "$PY" "$WORK/load.py" "$gpu" 16 "$gib" "$WORK/ready-$gpu" >>"$CAP/load-$name.jsonl" 2>>"$LOG" &
        pids+=($!)
    done
    for waited in $(seq 1 120); do
        [ "$(ls "$WORK"/ready-* 2>/dev/null | wc -l)" -ge "$(echo "$spec" | wc -w)" ] && break
        sleep 0.5
    done
    sleep 2
    timeout 20 nvidia-smi dmon -s um -c 8 -d 1 >"$CAP/dmon-$name.txt" 2>>"$LOG" &
    pids+=($!)
    timeout 8 nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total \
        --format=csv,noheader,nounits -lms 500 >"$CAP/query-$name.csv" 2>>"$LOG"
    wait "${pids[@]}" 2>/dev/null
    log "balance $name: $(wc -l <"$CAP/dmon-$name.txt" 2>/dev/null) dmon lines, $(wc -l <"$CAP/query-$name.csv" 2>/dev/null) query lines"
}
if [ "$CPU_SMOKE" != 1 ] && [ "$NGPU" -ge 2 ]; then
    balance_phase balanced "0:24 1:24"
    balance_phase unbalanced "0:48"
fi

# ---- 4. forced slow paths (the verdict must fail them) and 5. the 2-node run ------------------
run_probe() { # run_probe NAME TIMEOUT ENV... -- ARGS...
    local name=$1 limit=$2 envs=()
    shift 2
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    step "$name" "$((limit + 30))" bash -c '"$@" >"$0"' "$CAP/probe-$name.json" \
        env "${envs[@]}" "$PY" "$PROBE" "$@" --timeout "$limit"
}
run_probe shm 120 NCCL_P2P_DISABLE=1 -- "${SMALL_ARGS[@]}"
run_probe socket 150 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -- "${SMALL_ARGS[@]}"
if [ "$CPU_SMOKE" = 1 ]; then
    NODE_ARGS=(--backend gloo --nproc-per-node 1 --min-bytes 1M --max-bytes 2M --warmup 1 --iters 2)
    VISIBLE0=() VISIBLE1=()
else
    NODE_ARGS=(--backend nccl --nproc-per-node 1 --min-bytes 1M --max-bytes 1G --factor 4 --warmup 3 --iters 10)
    VISIBLE0=(CUDA_VISIBLE_DEVICES=0) VISIBLE1=(CUDA_VISIBLE_DEVICES=1)
fi
run_probe node1 150 "${VISIBLE1[@]}" -- "${NODE_ARGS[@]}" --nnodes 2 --node-rank 1 --master-port 29531 &
NODE1_PID=$!
run_probe node0 150 "${VISIBLE0[@]}" -- "${NODE_ARGS[@]}" --nnodes 2 --node-rank 0 --master-port 29531
wait "$NODE1_PID"

# ---- 3. the comparison, on an idle CPU: probe, nccl-tests, probe again -------------------------
if [ -n "$BUILD_PID" ]; then
    wait "$BUILD_PID"
fi
run_probe main 300 -- "${PROBE_ARGS[@]}"
if [ -x "$NT_BIN" ]; then
    step nccl_tests 300 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,NET \
        NCCL_DEBUG_FILE="$CAP/nccl-tests-nccl.%h.%p.log" \
        LD_LIBRARY_PATH="$NCCL_HOME_DIR/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}" \
        bash -c '"$@" >"$0"' "$CAP/all_reduce_perf.log" \
        "$NT_BIN" -b 1M -e 4G -f 2 -g "$NGPU" -w 5 -n 20 -d bfloat16
else
    log "no all_reduce_perf binary: the comparison is skipped"
fi
run_probe repeat 300 -- "${PROBE_ARGS[@]}"
if [ "$CPU_SMOKE" != 1 ]; then
    run_probe graph 300 -- "${PROBE_ARGS[@]}" --cuda-graph
fi

capture settings-after.csv nvidia-smi "$SETTINGS_QUERY" --format=csv

# ---- summary through the project's own parsers ---------------------------------------------------
"$PY" - "$CAP" "$OUT_DIR" "$CPU_SMOKE" >>"$LOG" 2>&1 <<'EOF'
import glob, json, os, sys
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import allreduce_bandwidth as bw
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import gpu_balance
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import nccl_transport
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi, nvidia_smi_query, nvidia_smi_tables, nvidia_smi_topo

cap, out, smoke = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
GIB = bw.GIB
summary = {"cpu_smoke": smoke, "errors": []}

def read(name):
    path = os.path.join(cap, name)
    return open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else None

def attempt(key, func):
    try:
        summary[key] = func()
    except Exception as exc:  # one missing piece must not hide the others
        summary["errors"].append(f"{key}: {type(exc).__name__}: {exc}")

def facts():
    xml = nvidia_smi_query.parse_query_xml(read("nvidia-smi-q.xml"))
    topo = nvidia_smi_topo.parse_topo_matrix(read("topo.txt"))
    links = nvidia_smi_topo.parse_nvlink_status(read("nvlink-s.txt")) if read("nvlink-s.txt") else None
    gpus = nvidia_smi.summarize_gpus(xml, topo, links)
    return {k: gpus.get(k) for k in ("count", "name", "driver_version", "cuda_version", "memory_total_mib",
                                     "compute_capability", "nvlink", "nvlink_links_per_pair", "nvswitch",
                                     "fabric_state", "persistence_mode", "mig_mode", "warnings")} | {
        "topo": topo["matrix"], "query_csv": nvidia_smi_tables.parse_query_gpu_csv(read("query-gpu.csv"))}
attempt("facts", facts)
nvlink = (summary.get("facts") or {}).get("nvlink")
gpu_name = (summary.get("facts") or {}).get("name")
summary["torch"] = json.loads(read("torch.json") or "{}")

def probe(name, expected):
    doc = json.loads(read(f"probe-{name}.json"))
    result = {k: doc.get(k) for k in ("ok", "error", "world_size", "nnodes", "node_rank", "backend", "dtype",
                                      "versions", "env_defaults_applied", "elapsed_s", "settings")}
    sweep = [bw.sweep_point(p["size_bytes"], p["time_us"], doc["world_size"],
                            **{k: p.get(k) for k in ("correct", "time_us_min", "time_us_max", "calls_per_trial",
                                                     "rank_spread_us", "cuda_graph", "cuda_graph_error")})
             for p in doc.get("sweep", [])]
    result["sweep"] = sweep
    transport = None
    if doc.get("backend") == "nccl":
        transport = nccl_transport.parse_nccl_debug(doc.get("nccl_debug_log") or "", p2p_over_nvlink=nvlink)
        with open(os.path.join(cap, f"probe-{name}-nccl-debug.log"), "w") as handle:
            handle.write(doc.get("nccl_debug_log") or "")
    result["transport"] = transport
    if sweep:
        result["verdict"] = bw.judge(sweep, doc["world_size"], gpu_name=gpu_name, transport=transport,
                                     expected_transport=expected, judge_bandwidth=doc.get("backend") == "nccl")
    return result

for name, expected in (("main", "nvlink"), ("repeat", "nvlink"), ("graph", "nvlink"), ("shm", "nvlink"),
                       ("socket", "nvlink"), ("node0", None), ("node1", None)):
    attempt(f"probe_{name}", lambda n=name, e=expected: probe(n, e))

def nccl_tests():
    parsed = bw.parse_nccl_tests(read("all_reduce_perf.log"))
    logs = "".join(open(p).read() for p in sorted(glob.glob(os.path.join(cap, "nccl-tests-nccl.*.log"))))
    transport = nccl_transport.parse_nccl_debug(logs, p2p_over_nvlink=nvlink)
    ours = summary["probe_main"]["sweep"]
    again = summary.get("probe_repeat", {}).get("sweep") or []
    graphed = summary.get("probe_graph", {}).get("sweep") or []
    compare = {}
    for placement in ("in_place", "out_of_place"):
        ref = bw.nccl_tests_sweep(parsed, placement)
        compare[placement] = bw.compare_sweeps(ours, ref, sizes=[GIB, 4 * GIB], tolerance=0.03)
        compare[placement + "_default_bands"] = bw.compare_sweeps(ours, ref)
        if again:
            compare[placement + "_repeat"] = bw.compare_sweeps(again, ref, sizes=[GIB, 4 * GIB], tolerance=0.03)
        if graphed:
            compare[placement + "_graph"] = bw.compare_sweeps(graphed, ref, sizes=[GIB, 4 * GIB], tolerance=0.03)
            compare[placement + "_graph_default_bands"] = bw.compare_sweeps(graphed, ref)
    return {"parsed": parsed, "transport": transport, "compare": compare}
attempt("nccl_tests", nccl_tests)

def query_rows(name, fields):
    text = read(f"query-{name}.csv") or ""
    whole = "\n".join(l for l in text.splitlines() if l.count(",") == len(fields) - 1)
    return nvidia_smi_tables.parse_query_gpu_csv(whole, fields=fields)

def balance(name):
    fields = ["index", "utilization.gpu", "memory.used", "memory.total"]
    rows = query_rows(name, fields)
    dmon = nvidia_smi_tables.parse_dmon(read(f"dmon-{name}.txt"))
    loads = [json.loads(l) for l in (read(f"load-{name}.jsonl") or "").splitlines() if l.strip()]
    return {
        "load": loads,
        "utilization_query": gpu_balance.utilization_balance(rows),
        "utilization_dmon": gpu_balance.utilization_balance(dmon),
        "memory_query": gpu_balance.memory_balance(rows),
        "memory_dmon": gpu_balance.memory_balance(dmon),
    }
for phase in ("balanced", "unbalanced"):
    if read(f"query-{phase}.csv") is not None:
        attempt(f"balance_{phase}", lambda p=phase: balance(p))

def settings(name):
    return nvidia_smi_tables.parse_query_gpu_csv(read(name) or "")
attempt("gpu_settings", lambda: {"before": settings("settings-before.csv"), "after": settings("settings-after.csv")})

steps = [l.split("\t") for l in (read("steps.tsv") or "").splitlines()[1:] if l.strip()]
summary["steps"] = [{"step": s[0], "rc": int(s[1]), "seconds": int(s[2]) / 1000} for s in steps]

# Acceptance, as the issue states it.
checks = {}
nt = summary.get("nccl_tests")
if nt:
    checks["busbw_within_3pct_at_1_and_4_GiB"] = nt["compare"]["in_place"]["agree"]
    if "in_place_repeat" in nt["compare"]:
        checks["repeat_within_3pct_at_1_and_4_GiB"] = nt["compare"]["in_place_repeat"]["agree"]
    if "in_place_graph" in nt["compare"]:
        checks["graph_within_3pct_at_1_and_4_GiB"] = nt["compare"]["in_place_graph"]["agree"]
    checks["same_nccl_library"] = nt["parsed"]["nccl_library"] == summary["torch"].get("nccl")
main = summary.get("probe_main")
if main and main.get("verdict"):
    checks["probe_verdict_pass"] = main["verdict"]["status"] == "pass"
for slow in ("shm", "socket"):
    if summary.get(f"probe_{slow}", {}).get("transport"):
        checks[f"forced_{slow}_detected"] = summary[f"probe_{slow}"]["transport"]["transport"] == slow
        checks[f"forced_{slow}_fails"] = summary[f"probe_{slow}"]["verdict"]["status"] == "fail"
if "balance_balanced" in summary:
    checks["balanced_load_passes"] = all(summary["balance_balanced"][k]["status"] == "pass"
                                         for k in ("utilization_query", "utilization_dmon", "memory_query", "memory_dmon"))
if "balance_unbalanced" in summary:
    checks["unbalanced_load_flagged"] = all(summary["balance_unbalanced"][k]["status"] == "fail"
                                            for k in ("utilization_query", "utilization_dmon", "memory_query", "memory_dmon"))
if summary.get("gpu_settings", {}).get("before"):
    checks["gpu_settings_unchanged"] = summary["gpu_settings"]["before"] == summary["gpu_settings"]["after"]
summary["checks"] = checks

with open(os.path.join(out, "summary.json"), "w") as handle:
    json.dump(summary, handle, indent=1, default=str)

lines = ["# proof run summary", ""]
if summary.get("facts"):
    f = summary["facts"]
    lines.append(f"device: {f['count']} x {f['name']}, driver {f['driver_version']}, CUDA {f['cuda_version']}, nvlink {f['nvlink']}")
lines.append(f"torch: {summary['torch']}")
if nt:
    p = nt["parsed"]
    lines.append(f"nccl-tests {p['nccl_tests_version']} headers {p['nccl_headers']} library {p['nccl_library']}")
    rows = {r["size_bytes"]: r for r in nt["compare"]["in_place_default_bands"]["rows"]}
    oop = {r["size_bytes"]: r for r in nt["compare"]["out_of_place_default_bands"]["rows"]}
    rep = {q["size_bytes"]: q for q in (summary.get("probe_repeat") or {}).get("sweep", [])}
    gra = {q["size_bytes"]: q for q in (summary.get("probe_graph") or {}).get("sweep", [])}
    lines.append("| size | probe | probe repeat | probe CUDA graph | nccl-tests in-place | out-of-place "
                 "| probe / in-place | repeat / in-place | graph / in-place |")
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sorted(rows):
        r = rows[size]
        ref = r["reference_busbw_gbps"]
        def cell(points, key="busbw_gbps"):
            return f"{points[size][key]:.2f}" if size in points else "-"
        def ratio(points):
            return f"{points[size]['busbw_gbps'] / ref:.4f}" if size in points else "-"
        other = f"{oop[size]['reference_busbw_gbps']:.2f}" if size in oop else "-"
        lines.append(f"| {bw.format_size(size)} | {r['ours_busbw_gbps']:.2f} | {cell(rep)} | {cell(gra)} | "
                     f"{ref:.2f} | {other} | {r['ratio']:.4f} | {ratio(rep)} | {ratio(gra)} |")
for name in ("main", "graph", "shm", "socket", "node0", "node1"):
    p = summary.get(f"probe_{name}")
    if p:
        t = p.get("transport") or {}
        v = p.get("verdict") or {}
        lines.append(f"probe {name}: ok={p['ok']} transport={t.get('transport')} paths={t.get('path_counts')} "
                     f"verdict={v.get('status')} {v.get('reasons')}")
for phase in ("balanced", "unbalanced"):
    b = summary.get(f"balance_{phase}")
    if b:
        for key in ("utilization_query", "utilization_dmon", "memory_query", "memory_dmon"):
            c = b[key]
            means = [round(g["mean"], 1) if g["mean"] is not None else None for g in c["gpus"]]
            lines.append(f"{phase} {key}: {c['status']} per-GPU means {means} {c['reasons']}")
lines.append(f"checks: {json.dumps(checks)}")
lines.append(f"errors: {summary['errors']}")
with open(os.path.join(out, "summary.md"), "w") as handle:
    handle.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

tar -C "$WORK" -czf "$OUT_DIR/captures.tgz" captures
cat "$OUT_DIR/summary.md" 2>/dev/null
log "done; results in $OUT_DIR"
rm -rf "$WORK"
