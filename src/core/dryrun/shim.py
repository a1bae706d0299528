"""SGLang's own start-up resolution of engine processes, with the GPU faked, on a CPU-only host.

One code for two users:
- the engine dry run (docs/dry-run.md): pd-operator ships this file in a ConfigMap, runs it with
  the PDDeployment's own engine image in a CPU-only pod, and reads the verdict from the pod's
  termination message (`python3 shim.py --input-env PD_DRY_RUN_INPUT --verdict /dev/termination-log`);
- the parity oracle (tests/parity/oracle.py), which imports it.

Per process, in its own forked child with a clean environment, the way `entrypoints/engine.py`
starts: parse the argv (`prepare_server_args`), resolve (`resolve_once`), check
(`check_server_args`), then the width checks of `distributed/parallel_state.initialize_model_parallel`
with the process groups stubbed, on the accelerator profile the spec names (H100, H200, B200).
SGLang is imported once with the real (CUDA-less) torch before the accelerator is faked.

Dry-run input (JSON): {"modelConfigDir": str|null, "processes": [{"role", "node", "profile",
"argv": [...], "env": [[k, v], ...], "envFromPod": [names]}]}. `envFromPod` names variables the
pod's own environment holds (secrets, field references). The verdict:
{"v": 1, "ok": bool, "sglang": version, "processes": [{"role", "node", "profile", "ok", "stage",
"error_type", "error", "resolved": {...}}]}; the one written to `--verdict` is cut to fit a
termination message (4096 bytes).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import os
import pkgutil
import sys
import tempfile
import traceback

PROFILES = {
    # name, compute capability, memory (bytes), SMs
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 81559 * 2**20, 132),
    "H200": ("NVIDIA H200", (9, 0), 143771 * 2**20, 132),
    "B200": ("NVIDIA B200", (10, 0), 183359 * 2**20, 148),
}
GPUS_PER_NODE = 8

# Resolved values worth comparing with what the operator renders and hands the sidecar.
RESOLVED_KEYS = [
    "page_size",
    "kv_cache_dtype",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "tp_size",
    "dp_size",
    "pp_size",
    "attn_cp_size",
    "dcp_size",
    "attn_dcp_size",
    "enable_dp_attention",
    "disaggregation_mode",
    "disaggregation_decode_allocation_policy",
    "speculative_algorithm",
    "enable_kv_cache_sharding",
    "disable_hybrid_swa_memory",
    "dsv4_attn_backend",
]

# Variables that must not leak from the host into a case (resolution reads and writes them).
ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def clean_env(extra, offline=True):
    """The process's own environment: the host's basics, what resolution must read as on a GPU
    node, then the process's variables. `offline` when the model's config is handed over as a
    directory (nothing is fetched from the Hugging Face hub)."""
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP}
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env["SGLANG_IS_FLASHINFER_AVAILABLE"] = "true"
    env.update(extra)
    return env


def import_sglang():
    """Import every module resolution reaches while torch still reports no CUDA: faking CUDA
    first makes lazy imports load sgl_kernel, which needs libcuda."""
    env = clean_env({})  # read before the clear: HOME and TMPDIR name the writable scratch directory
    os.environ.clear()
    os.environ.update(env)
    import torch  # noqa: F401

    import sglang.srt.arg_groups as groups
    import sglang.srt.server_args  # noqa: F401

    for info in pkgutil.walk_packages(groups.__path__, groups.__name__ + "."):
        importlib.import_module(info.name)
    for name in [
        "sglang.srt.configs.model_config",
        "sglang.srt.kernel_plugins.nvidia.binding",
        "sglang.srt.kernel_plugins.amd.binding",
        "sglang.srt.distributed.parallel_state",
        "sglang.srt.layers.sampler",
        "sglang.srt.runtime_context",
        "sglang.srt.platforms.cuda",
        "sglang.srt.utils.common",
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        "sglang.srt.disaggregation.utils",
    ]:
        try:
            importlib.import_module(name)
        except Exception as e:  # a module a profile does not reach is not fatal
            print(f"oracle: import {name}: {type(e).__name__}: {e}", file=sys.stderr)


class _Props:
    def __init__(self, name, cap, mem, sms):
        self.name, self.major, self.minor = name, cap[0], cap[1]
        self.total_memory, self.multi_processor_count = mem, sms
        self.is_integrated = False
        self.L2_cache_size = 50 * 2**20
        self.uuid = "GPU-00000000-0000-0000-0000-000000000000"


def fake_accelerator(profile):
    import torch

    name, cap, mem, sms = PROFILES[profile]
    props = _Props(name, cap, mem, sms)
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: GPUS_PER_NODE
    c.get_device_capability = lambda device=None: cap
    c.get_device_name = lambda device=None: name
    c.get_device_properties = lambda device=None: props
    c.mem_get_info = lambda device=None: (mem - 2 * 2**30, mem)
    c.current_device = lambda: 0
    c.is_initialized = lambda: True
    mem_mib = mem / 2**20

    import sglang.srt.platforms as platforms
    import sglang.srt.platforms.cuda as cuda_platform

    platform = cuda_platform.CudaSRTPlatform()
    platforms._current_platform = platform
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("sglang"):
            continue
        d = getattr(mod, "__dict__", {})
        if "get_nvgpu_memory_capacity" in d:
            d["get_nvgpu_memory_capacity"] = lambda: mem_mib
        if "current_platform" in d:
            d["current_platform"] = platform
        if "is_flashinfer_available" in d:
            d["is_flashinfer_available"] = lambda: True
        for value in list(d.values()):
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()


class _Group:
    """Stands in for a process group (rank 0's): every other attribute or call answers a stand-in."""

    def __init__(self, ranks=(0,)):
        self.ranks = list(ranks)
        self.world_size = len(self.ranks)
        self.rank_in_group = 0
        self.rank = 0

    def __getattr__(self, _):
        return _Group()

    def __call__(self, *a, **k):
        return _Group()


def parallel_state_checks(sa):
    """The width checks of initialize_model_parallel (tp % dcp, ...) with groups stubbed."""
    import torch

    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state as ps

    runtime_context.publish(sa, role="scheduler")
    parallel = ps.get_parallel() if hasattr(ps, "get_parallel") else None
    world = parallel.tp_size * parallel.pp_size if parallel is not None else sa.tp_size * sa.pp_size
    torch.distributed.is_initialized = lambda: True
    torch.distributed.get_world_size = lambda group=None: world
    torch.distributed.get_rank = lambda group=None: 0
    torch.distributed.get_backend = lambda group=None: "nccl"
    ps.get_world_group = lambda: _Group()
    ps.init_model_parallel_group = lambda group_ranks, *a, **k: _Group(next((g for g in group_ranks if 0 in g), group_ranks[0]))
    ps.initialize_model_parallel(**model_parallel_sizes(ps, parallel, sa))


def model_parallel_sizes(ps, parallel, sa):
    """The widths initialize_model_parallel takes as arguments before 0.5.21 (it reads the runtime
    context from then on), as that release's bootstrap passes them."""
    import inspect

    if "tensor_model_parallel_size" not in inspect.signature(ps.initialize_model_parallel).parameters:
        return {}

    def size(*candidates):
        for source, attr in candidates:
            try:  # a derived width is not available before the groups exist (0.5.19)
                value = getattr(source, attr, None) if source is not None else None
            except Exception:  # noqa: BLE001
                value = None
            if isinstance(value, int) and value > 0:
                return value
        return 1

    def leaf(name, *args):
        """The runtime context's width, else the server argument's."""
        return size((parallel, name), *((sa, a) for a in args))

    attn_dp = leaf("attn_dp_size", "attn_dp_size")
    if attn_dp == 1 and getattr(sa, "enable_dp_attention", False):
        attn_dp = leaf("dp_size", "dp_size")  # before 0.5.22 the attention-DP width is --dp-size

    return {
        "tensor_model_parallel_size": leaf("tp_size", "tp_size"),
        "attention_data_parallel_size": attn_dp,
        "pipeline_model_parallel_size": leaf("pp_size", "pp_size"),
        "expert_model_parallel_size": leaf("moe_ep_size", "ep_size"),
        "attention_context_model_parallel_size": leaf("attn_cp_size", "attn_cp_size"),
        "moe_data_model_parallel_size": leaf("moe_dp_size", "moe_dp_size"),
        # 0.5.19's context holds no DCP width before the groups exist: the argument's.
        "decode_context_parallel_size": size((sa, "dcp_size"), (parallel, "attn_dcp_size")),
    }


def resolved_values(sa):
    try:
        d = sa.resolved_dict()
    except Exception as e:  # report what we can
        return {"_error": f"{type(e).__name__}: {e}"}
    out = {}
    for k in RESOLVED_KEYS:
        if k in d:
            v = d[k]
            out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
    for k, v in d.items():
        if k not in out and ("kv_layout" in k or k.startswith("dsv4")):
            out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
    return out


def dsv4_pd_kv_layout(sa):
    """What this process's DeepSeek-V4 pool reports in the PD handshake, by SGLang's own code:
    `select_dsv4_kv_layout()` on the faked GPU (after the scheduler's runtime context is
    published), then `get_pd_kv_layout()` on a `DeepSeekV4TokenToKVPool`. Only the pool's buffer
    allocation is skipped (it needs a GPU): the pool is made with `object.__new__`, as SGLang's
    own disaggregation wire test does, and given the attributes its __init__ sets for
    `pd_kv_layout` (the selected layouts, the model's `compress_ratios` as kv_cache_configurator
    passes them, and `uniform_fp8` from the same two calls). None for other models."""
    from sglang.srt.arg_groups.model_override_base import model_config_of

    ratios = getattr(model_config_of(sa), "compress_ratios", None)
    if ratios is None:
        return {}
    try:
        from sglang.srt.disaggregation.utils import get_pd_kv_layout
    except ImportError:  # a release whose handshake carries no KV layout (before 0.5.23)
        return {}
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.layers.attention.dsv4.unified_kv_gate import is_unified_kv_triton
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool, select_dsv4_kv_layout
    from sglang.srt.runtime_context import get_exec

    try:
        layout, option = select_dsv4_kv_layout()
        pool = object.__new__(DeepSeekV4TokenToKVPool)
        pool.kv_layout = KVLayout.parse(layout)
        pool.compressed_kv_layout_option = option
        pool.compression_ratios = list(ratios)
        pool.uniform_fp8 = (not is_unified_kv_triton()) and get_exec().kernel.dsv4_attn_backend == "trtllm"
        return {"pd_kv_layout": get_pd_kv_layout(pool)}
    except Exception as e:  # the pool would refuse this layout after the weights load
        return {"pd_kv_layout_error": f"{type(e).__name__}: {e}"}


def fake_ib_devices(argv):
    """The host's InfiniBand devices are not the spec's business: answer that the devices the
    argv names exist (SGLang checks them against /sys/class/infiniband at start-up)."""
    value = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--disaggregation-ib-device"), None)
    if value is None:
        return
    try:
        parsed = json.loads(value)
        names = {d.strip() for v in parsed.values() for d in str(v).split(",")} if isinstance(parsed, dict) else set()
    except ValueError:
        names = {d.strip() for d in value.split(",")}
    sysfs = "/sys/class/infiniband"
    isdir, listdir = os.path.isdir, os.listdir
    os.path.isdir = lambda p: True if p == sysfs else isdir(p)
    os.listdir = lambda p=".": sorted(names) if p == sysfs else listdir(p)


def process_argv(proc, model_dir):
    """The process's argv and environment, installed in this (child) process: the model path
    replaced by `model_dir` when given, the named InfiniBand devices answered, a clean environment."""
    import logging

    logging.disable(logging.CRITICAL)
    argv = list(proc["argv"])
    for i, a in enumerate(argv[:-1]):
        if model_dir is not None and a in ("--model-path", "--model"):
            argv[i + 1] = model_dir
    fake_ib_devices(argv)
    env = clean_env(dict(proc.get("env", [])), offline=model_dir is not None)
    os.environ.clear()
    os.environ.update(env)
    return argv


def run_process(proc, model_dir):
    """Child body: one engine process's start-up; returns the result dict. `model_dir` holds the
    model's config.json and replaces the argv's model path; None leaves the path to SGLang."""
    argv = process_argv(proc, model_dir)
    from sglang.srt.server_args import prepare_server_args

    stage = "parse"
    sa = None
    try:
        import contextlib
        import io

        err = io.StringIO()
        try:
            # `--help` prints the usage on stdout and exits 0: keep it out of the results stream.
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                sa = prepare_server_args(argv)
        except SystemExit as e:  # argparse prints `prog: error: <text>` and exits 2
            text = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
            return {"ok": False, "stage": stage, "error_type": "SystemExit", "error": text.split("error: ", 1)[-1]}
        stage = "resolve"
        sa.resolve_once()
        stage = "check"
        sa.check_server_args()
        stage = "parallel_state"
        resolved = resolved_values(sa)
        parallel_state_checks(sa)
        resolved.update(dsv4_pd_kv_layout(sa))
        return {"ok": True, "stage": "done", "resolved": resolved}
    except BaseException as e:  # noqa: BLE001 - every failure is the verdict
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(tb) if "sglang" in f.filename), "")
        out = {"ok": False, "stage": stage, "error_type": type(e).__name__, "error": str(e), "where": where}
        if sa is not None and stage != "resolve":
            out["resolved"] = resolved_values(sa)
        return out


def in_child(fn, *args, timeout=120):
    """Runs fn in a forked child; returns its JSON result (or a crash report)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = fn(*args)
        except BaseException as e:  # noqa: BLE001
            res = {"ok": False, "stage": "oracle", "error_type": type(e).__name__, "error": str(e)}
        data = json.dumps(res, default=str).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"ok": False, "stage": "oracle", "error_type": "ChildCrashed", "error": f"wait status {status}"}
    return json.loads(data)


def model_dir_for(config, cache):
    text = json.dumps(config, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    if key not in cache:
        d = os.path.join(cache["_root"], key)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(text)
        cache[key] = d
    return cache[key]


# ---- The PD handshake, by SGLang's own code ------------------------------------------------------
# After every process started, the first prefill and decode processes (node 0 of each role) meet as
# they do at the first request: each prefill rank's KV manager registers with a real
# `CommonKVBootstrapServer` over HTTP (`register_to_bootstrap`), each decode rank's KV manager asks
# it (`try_ensure_parallel_info`: page size, KV dtype and layout, DCP, CP, PP checks and the rank
# mapping), and each prefill rank a decode rank pulls from answers the decode's registration
# (`requires_dcp_relayout`). Ranks are placed by the release's own launcher placement
# (`runtime_context.publish(..., ranks=SpawnRanks(world_rank))`, from 0.5.21). The KV managers are
# SGLang's `CommonKVManager`, built by its own __init__ on KV arguments that hold what the
# handshake reads: the resolved page size, the model runner's KV dtype string
# (`configure_kv_cache_dtype`), the pool's kind (`AttentionArch.MLA`, `mambaish_config`) and
# the DeepSeek-V4 KV layout. Buffers (pointers, item lengths) need a GPU and are not built.


def handshake_pair(processes, results):
    """The node-0 prefill and decode processes, when both passed their start-up."""
    first = {}
    for proc, res in zip(processes, results):
        if proc["node"] == 0 and res.get("ok") and proc["role"] not in first:
            first[proc["role"]] = proc
    return (first["prefill"], first["decode"]) if {"prefill", "decode"} <= first.keys() else None


def started(proc, model_dir):
    """The process's server arguments after SGLang's start-up (they passed it before)."""
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(process_argv(proc, model_dir))
    sa.resolve_once()
    sa.check_server_args()
    parallel_state_checks(sa)
    return sa


def placements(sa):
    """(world_rank, dp_rank) of every scheduler of one instance, as the launcher spawns them."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    world = parallel.tp_size * parallel.pp_size
    replicas = [None] if sa.enable_dp_attention or sa.dp_size == 1 else list(range(sa.dp_size))
    return [(r, d) for d in replicas for r in range(world)]


def pool_kind(sa):
    """(is_mla_backend, is_hybrid_mla_backend) of the pool the model runner builds."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import AttentionArch

    model_config = model_config_of(sa)
    mla = model_config.attention_arch == AttentionArch.MLA
    hybrid = mambaish_config(model_config) is not None
    try:  # the DeepSeek-V4 pool is an MLA pool to the handshake (`utils.is_mla_backend`)
        from sglang.srt.configs.model_config import is_deepseek_v4

        dsv4 = is_deepseek_v4(model_config.hf_config)
    except ImportError:
        dsv4 = False
    return ((mla and not hybrid) or dsv4, mla and hybrid)


def pool_page_size(sa):
    """The pool's page size: the scheduling bag's (the server argument before resolution may differ)."""
    from sglang.srt import runtime_context as rc

    try:
        return rc.get_schedule().page_size
    except (AttributeError, RuntimeError):
        return sa.resolved_dict()["page_size"]


def kv_dtype_str():
    """The model runner's KV dtype string (`configure_kv_cache_dtype`, the model not loaded)."""
    import torch

    from sglang.srt.runtime_context import get_model

    try:
        from sglang.srt.mem_cache import kv_cache_dtype as kvd
    except ImportError:  # before the function had its own module: the server argument
        return get_model().kv_cache_dtype
    resolved, _ = kvd.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=get_model().kv_cache_dtype, model=None, model_dtype=torch.bfloat16,
        is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
    return resolved if resolved is not None else get_model().kv_cache_dtype


def kv_manager(sa, mode, placement, kind, layout):
    """SGLang's CommonKVManager for one rank, built by its own __init__."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode

    world_rank, dp_rank = placement
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=world_rank, dp_rank=dp_rank))
    parallel = rc.get_parallel()
    args = KVArgs()
    args.engine_rank = parallel.tp_rank if mode == "prefill" else parallel.tp_rank % parallel.attn_tp_size
    args.pp_rank, args.system_dp_rank = parallel.pp_rank, parallel.dp_rank
    args.kv_cache_dtype_str, args.kv_layout, args.page_size = kv_dtype_str(), layout, pool_page_size(sa)
    args.kv_item_lens, args.state_item_lens, args.state_types = [], [], []
    args.is_hybrid_mla_backend, args.num_draft_entries = kind[1], 0
    return CommonKVManager(args, DisaggregationMode(mode), sa, is_mla_backend=kind[0])


def loopback_for_unknown_hosts():
    """The pods' host names do not resolve where the dry run runs, and the engine pod's own
    address (`SGLANG_HOST_IP`, the interfaces) is not this pod's: they answer loopback (addresses
    are not the spec's business, and the handshake reads none)."""
    import socket

    from sglang.srt.disaggregation.common import conn

    conn.get_local_ip_auto = lambda *a, **k: "127.0.0.1"

    real = socket.getaddrinfo

    def getaddrinfo(host, *a, **k):
        try:
            return real(host, *a, **k)
        except socket.gaierror:
            return real("127.0.0.1", *a, **k)

    socket.getaddrinfo = getaddrinfo


def prefill_side(proc, model_dir):
    """Child body: every prefill rank's registration (SGLang's `register_to_bootstrap` payload) and
    what its sender-side checks read."""
    import requests

    from sglang.srt.disaggregation.common import conn

    sa = started(proc, model_dir)
    loopback_for_unknown_hosts()
    # Every node renders the same bootstrap port: nothing to broadcast. The PP status store
    # needs a live PP group and holds no topology.
    conn.CommonKVManager._sync_bootstrap_port_across_nodes = lambda self, port: port
    conn.PPConsensusStore = lambda *a, **k: {}
    rows = []
    requests.put = lambda url, json=None, **k: rows.append(json) or type("R", (), {"status_code": 200})()
    kind, layout = pool_kind(sa), dsv4_pd_kv_layout(sa).get("pd_kv_layout")
    senders = []
    for placement in placements(sa):
        m = kv_manager(sa, "prefill", placement, kind, layout)
        senders.append({"key": [rows[-1]["attn_dp_rank"], rows[-1]["attn_cp_rank"], rows[-1]["attn_tp_rank"], rows[-1]["pp_rank"]],
                        "dcp_size": m.dcp_size, "dcp_rank": m.dcp_rank, "mla": m.is_mla_backend, "hybrid": m.is_hybrid_mla_backend})
    return {"ok": True, "rows": rows, "senders": senders}


def bootstrap_server(rows):
    """SGLang's bootstrap server on a free loopback port, every prefill row registered over HTTP."""
    import socket
    import time

    import requests

    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    CommonKVBootstrapServer("127.0.0.1", port)
    addr = f"127.0.0.1:{port}"
    for _ in range(100):
        try:
            if requests.get(f"http://{addr}/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.05)
    for row in rows:
        answer = requests.put(f"http://{addr}/route", json=row, timeout=5)
        if answer.status_code != 200:
            raise RuntimeError(f"the bootstrap server refused a prefill rank: {answer.text}")
    return addr


def sender_check(senders, info, decode):
    """Each prefill rank this decode rank pulls from answers its registration as the sender does."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    by_key = {tuple(s["key"]): s for s in senders}
    for cp in info.target_cp_ranks:
        for tp in info.target_tp_ranks:
            for pp in info.target_pp_ranks:
                s = by_key.get((0, cp, tp, pp))
                if s is None:
                    continue
                sender = object.__new__(CommonKVManager)
                sender.dcp_size, sender.dcp_rank = s["dcp_size"], s["dcp_rank"]
                sender.is_mla_backend, sender.is_hybrid_mla_backend = s["mla"], s["hybrid"]
                sender.requires_dcp_relayout(decode.dcp_size, decode.dcp_rank)


def decode_side(proc, model_dir, prefill):
    """Child body: every decode rank asks SGLang's bootstrap server for the prefill's topology and
    runs its checks; the rank map SGLang computes, or its refusal."""
    sa = started(proc, model_dir)
    loopback_for_unknown_hosts()
    addr = bootstrap_server(prefill["rows"])
    kind, layout = pool_kind(sa), dsv4_pd_kv_layout(sa).get("pd_kv_layout")
    rank_map, stage = [], "decode_handshake"
    try:
        for placement in placements(sa):
            stage = "decode_handshake"
            m = kv_manager(sa, "decode", placement, kind, layout)
            if not m.try_ensure_parallel_info(addr):
                raise RuntimeError("the prefill's bootstrap server gave no topology")
            info = m.prefill_info_table[addr]
            rank_map.append({"decode": [m.attn_cp_rank, m.attn_tp_rank, m.pp_rank, m.dcp_rank], "tp": info.target_tp_ranks,
                             "cp": info.target_cp_ranks, "pp": info.target_pp_ranks,
                             "responses": info.required_prefill_response_num})
            stage = "prefill_sender"
            sender_check(prefill["senders"], info, m)
    except BaseException as e:  # noqa: BLE001 - SGLang's refusal is the verdict
        return {"ok": False, "stage": stage, "error_type": type(e).__name__, "error": str(e), "rank_map": rank_map}
    return {"ok": True, "stage": "done", "rank_map": rank_map}


def on_profile(profile, fn, *args):
    """Worker body: fake one accelerator, then fn in its own child."""
    fake_accelerator(profile)
    return in_child(fn, *args)


def on_own_profile(proc, fn, *args):
    """Runs a handshake side on its process's own accelerator (the dry run's processes name theirs)."""
    return in_child(on_profile, proc.get("profile", "H100"), fn, *args)


def handshake(processes, results, model_dir, side=on_own_profile):
    """The handshake verdict: SGLang's own checks between the first prefill and decode processes.
    `side(proc, fn, *args)` runs one role's side (the parity oracle runs both on its faked profile)."""
    import inspect

    from sglang.srt import runtime_context as rc

    pair = handshake_pair(processes, results)
    if pair is None:
        return {"ok": True, "ran": False, "note": "no prefill and decode process passed their start-up"}
    if "ranks" not in inspect.signature(rc.publish).parameters:
        return {"ok": True, "ran": False, "note": f"SGLang {sglang_version()} places no ranks at publish (before 0.5.21): "
                "the handshake is judged by pd-operator's rules and the sidecar only"}
    prefill, decode = pair
    sent = side(prefill, prefill_side, prefill, model_dir)
    if not sent.get("ok"):
        return dict(sent, ran=True, stage="prefill_register")
    got = side(decode, decode_side, decode, model_dir, sent)
    return dict(got, ran=True, prefill_profile=prefill.get("profile"), decode_profile=decode.get("profile"))

# A termination message holds 4096 bytes; the verdict written there keeps under this.
VERDICT_BYTES = 3800
# What the termination message keeps of a process's resolved values.
VERDICT_RESOLVED = ("page_size", "kv_cache_dtype", "attention_backend", "disaggregation_mode")


def sglang_version():
    try:
        import sglang

        return getattr(sglang, "__version__", "unknown")
    except Exception:  # noqa: BLE001 - the verdict says what it can
        return "unknown"


def profile_results(profile, procs, model_dir):
    """Worker body: fake one accelerator, then each process in its own child."""
    fake_accelerator(profile)
    out = []
    for proc in procs:
        res = in_child(run_process, proc, model_dir)
        res.update({"role": proc["role"], "node": proc["node"], "profile": profile})
        out.append(res)
    return out


def dry_run(case):
    """Every process of `case` (the dry-run input), grouped by accelerator; the full verdict."""
    import_sglang()
    by_profile = {}
    for i, proc in enumerate(case["processes"]):
        by_profile.setdefault(proc.get("profile", "H100"), []).append((i, proc))
    results = [None] * len(case["processes"])
    for profile, procs in by_profile.items():
        got = in_child(profile_results, profile, [p for _, p in procs], case.get("modelConfigDir"))
        if isinstance(got, dict):  # the worker itself crashed
            got = [dict(got, role=p["role"], node=p["node"], profile=profile) for _, p in procs]
        for (i, _), res in zip(procs, got):
            results[i] = res
    shake = handshake(case["processes"], results, case.get("modelConfigDir"))
    ok = all(r.get("ok") for r in results) and shake["ok"]
    return {"v": 1, "ok": ok, "sglang": sglang_version(), "processes": results, "handshake": shake}


def compact(verdict, limit=VERDICT_BYTES):
    """The verdict cut to `limit` bytes of JSON: resolved values trimmed, then error texts shortened."""
    small = dict(verdict)
    small["processes"] = [
        {**{k: v for k, v in p.items() if k != "resolved" and k != "where"},
         "resolved": {k: v for k, v in (p.get("resolved") or {}).items() if k in VERDICT_RESOLVED}}
        for p in verdict["processes"]
    ]
    if "handshake" in verdict:
        small["handshake"] = {k: v for k, v in verdict["handshake"].items() if k not in ("rank_map", "where")}
    text = json.dumps(small, separators=(",", ":"), default=str)
    cut = 1000
    while len(text.encode()) > limit and cut > 40:
        for p in small["processes"] + [small.get("handshake", {})]:
            if len(p.get("error", "")) > cut:
                p["error"] = p["error"][:cut] + "..."
            p.pop("resolved", None) if cut < 400 else None
        text = json.dumps(small, separators=(",", ":"), default=str)
        cut //= 2
    return text


def read_input(args):
    if args.input_env:
        return json.loads(os.environ[args.input_env])
    with (sys.stdin if args.input == "-" else open(args.input)) as f:
        return json.load(f)


def with_pod_env(case):
    """Each process's `envFromPod` variables, from this pod's environment (read before SGLang's
    import clears it)."""
    for proc in case["processes"]:
        names = proc.get("envFromPod", [])
        proc["env"] = list(proc.get("env", [])) + [[n, os.environ[n]] for n in names if n in os.environ]
    return case


def main():
    ap = argparse.ArgumentParser(description="pd-operator engine dry run: SGLang's start-up resolution per process")
    ap.add_argument("--input", default="-", help="the dry-run input (JSON file, - for stdin)")
    ap.add_argument("--input-env", help="read the input from this environment variable instead")
    ap.add_argument("--verdict", help="also write the compact verdict here (the termination message)")
    args = ap.parse_args()
    case = with_pod_env(read_input(args))
    verdict = dry_run(case)
    print(json.dumps(verdict, default=str), flush=True)
    if args.verdict:
        with open(args.verdict, "w") as f:
            f.write(compact(verdict))


if __name__ == "__main__":
    main()
