"""SGLang 0.5.23's own start-up resolution as a test oracle, on a CPU-only host.

Reads JSON lines on stdin, one case each:
  {"id": str, "profile": "H100"|"H200"|"B200", "config": {config.json},
   "processes": [{"role": "prefill"|"decode", "node": int, "argv": [...], "env": [[k, v], ...]}]}
and writes one JSON line per case on stdout:
  {"id": str, "profile": str, "processes": [{"role", "node", "ok", "error_type", "error",
   "stage", "resolved": {...}}], "handshake": {"ok", "ran", "stage", "error_type", "error", "rank_map"}}

SGLang is imported once with the real (CUDA-less) torch. Then, per accelerator profile, a forked
worker patches what resolution reads about the GPU, and each engine process of each case runs in
its own forked child with a clean environment, the way `entrypoints/engine.py` starts: parse the
argv (`prepare_server_args`), resolve (`resolve_once`), check (`check_server_args`), then the
width checks of `distributed/parallel_state.initialize_model_parallel` with the process groups
stubbed; then the handshake of the case's first prefill and decode processes by SGLang's own KV
managers and bootstrap server (the shim's `handshake`). Run with the python that hack/sglang-oracle-venv.sh prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

# The per-process resolution is the engine dry run's shim: one code for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "core", "dryrun"))
from shim import fake_accelerator, handshake, import_sglang, in_child, model_dir_for, run_process  # noqa: E402


def same_profile(_proc, fn, *args):
    """Both roles of a case run on the case's one faked profile."""
    return in_child(fn, *args)


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
            shake = handshake(case["processes"], results, model_dir, side=same_profile)
            out.write(json.dumps({"id": case["id"], "profile": profile, "processes": results, "handshake": shake}) + "\n")
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
