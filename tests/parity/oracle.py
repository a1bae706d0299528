"""SGLang 0.5.23's own start-up resolution as a test oracle, on a CPU-only host.

Reads JSON lines on stdin, one case each:
  {"id": str, "profile": "H100"|"H200"|"B200", "config": {config.json},
   "processes": [{"role": "prefill"|"decode", "node": int, "argv": [...], "env": [[k, v], ...]}]}
and writes one JSON line per case on stdout:
  {"id": str, "profile": str, "processes": [{"role", "node", "ok", "error_type", "error",
   "stage", "resolved": {...}}]}

SGLang is imported once with the real (CUDA-less) torch. Then, per accelerator profile, a forked
worker patches what resolution reads about the GPU, and each engine process of each case runs in
its own forked child with a clean environment, the way `entrypoints/engine.py` starts: parse the
argv (`prepare_server_args`), resolve (`resolve_once`), check (`check_server_args`), then the
width checks of `distributed/parallel_state.initialize_model_parallel` with the process groups
stubbed. Run with the python that hack/sglang-oracle-venv.sh prints.
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


def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SGLANG_IS_FLASHINFER_AVAILABLE": "true"})
    env.update(extra)
    return env


def import_sglang():
    """Import every module resolution reaches while torch still reports no CUDA: faking CUDA
    first makes lazy imports load sgl_kernel, which needs libcuda."""
    os.environ.clear()
    os.environ.update(clean_env({}))
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
    ps.initialize_model_parallel()


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


def run_process(proc, model_dir):
    """Child body: one engine process's start-up; returns the result dict."""
    import logging

    logging.disable(logging.CRITICAL)
    argv = list(proc["argv"])
    for i, a in enumerate(argv[:-1]):
        if a in ("--model-path", "--model"):
            argv[i + 1] = model_dir
    fake_ib_devices(argv)
    os.environ.clear()
    os.environ.update(clean_env(dict(proc.get("env", []))))
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


def profile_worker(profile, cases, out_fd):
    fake_accelerator(profile)
    dirs = {"_root": tempfile.mkdtemp(prefix="pd-parity-models-")}
    with os.fdopen(out_fd, "w") as out:
        for case in cases:
            model_dir = model_dir_for(case["config"], dirs)
            results = []
            for proc in case["processes"]:
                res = in_child(run_process, proc, model_dir)
                res.update({"role": proc["role"], "node": proc["node"]})
                results.append(res)
            out.write(json.dumps({"id": case["id"], "profile": profile, "processes": results}) + "\n")
            out.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default="-")
    ap.add_argument("--output", default="-")
    ap.add_argument("--jobs", type=int, default=1, help="forked workers per profile")
    args = ap.parse_args()
    src = sys.stdin if args.input == "-" else open(args.input)
    cases = [json.loads(line) for line in src if line.strip()]
    import_sglang()
    by_profile = {}
    for c in cases:
        by_profile.setdefault(c["profile"], []).append(c)
    out = sys.stdout if args.output == "-" else open(args.output, "w")
    jobs = max(1, args.jobs)
    for profile, group in by_profile.items():
        workers = []
        for j in range(jobs):
            fd, path = tempfile.mkstemp(prefix=f"pd-parity-{profile}-{j}-", suffix=".jsonl")
            pid = os.fork()
            if pid == 0:
                try:
                    profile_worker(profile, group[j::jobs], fd)
                finally:
                    os._exit(0)
            os.close(fd)
            workers.append((pid, path))
        for pid, path in workers:
            os.waitpid(pid, 0)
            with open(path) as f:
                out.write(f.read())
            out.flush()
            os.unlink(path)

if __name__ == "__main__":
    main()
