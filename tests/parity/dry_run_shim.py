"""The engine dry run's shim (src/core/dryrun/shim.py) on one SGLang release, as the dry-run pod
runs it: the input in an environment variable, the verdict on stdout and, cut to a termination
message, in a file. Processes SGLang accepts, one whose extraArgs its parser refuses and one its
checks refuse after resolving, each on another accelerator profile; then pairs that start and whose
handshake SGLang refuses (the decode's checks, the prefill sender's). Each must get SGLang's own
verdict.
   python tests/parity/dry_run_shim.py --python PY [--release-dir DIR] --expect-version 0.5.21
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "..", "..", "src", "core", "dryrun", "shim.py")


def argv(role, extra=()):
    return ["--model-path", "Qwen/Qwen3-8B", "--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake",
            "--tp-size", "2", "--dp-size", "1", "--pp-size", "1", "--page-size", "64", "--kv-cache-dtype", "auto",
            "--host", "0.0.0.0", "--port", "30000", *extra]


# One input, as one dry run of a PDDeployment: (role, node, profile, extraArgs, want ok, want stage,
# a word of SGLang's text). Two processes SGLang accepts; one whose extraArgs its argument parser
# refuses; one its parallel-state width checks refuse (tp 2 is not a multiple of dcp 3).
PROCESSES = [
    ("prefill", 0, "H100", (), True, "done", None),
    ("decode", 0, "H200", (), True, "done", None),
    ("prefill", 1, "B200", ("--no-such-flag",), False, "parse", "unrecognized arguments"),
    ("decode", 1, "H100", ("--dcp-size", "3"), False, None, None),
]


# Pairs whose processes SGLang starts and whose handshake it refuses (config, prefill extra args,
# decode extra args, stage, SGLang's text): the decode's check of the prefill's topology, and the
# prefill sender's answer to the decode's registration (docs/dry-run.md).
HANDSHAKES = [
    ("Qwen3ForCausalLM", (), ("--dcp-size", "2"), "decode_handshake", "PD decode DCP requires an MLA or hybrid-MLA KV pool."),
    ("DeepseekV3ForCausalLM", ("--tp-size", "8", "--dcp-size", "2"), ("--tp-size", "8", "--dcp-size", "4"), "prefill_sender",
     "Unsupported PD DCP topology: 2 -> 4"),
]
# The first release whose launcher placement (`publish(..., ranks=)`) the handshake stage uses.
HANDSHAKE_FROM = (0, 5, 21)


def run(python, release_dir, model_dir, processes=None):
    case = {"modelConfigDir": model_dir, "processes": processes or [
        {"role": role, "node": node, "profile": profile, "argv": argv(role, extra),
         "env": [["SGLANG_DRY_RUN_LITERAL", "1"]], "envFromPod": ["PD_TEST_FROM_POD"]}
        for role, node, profile, extra, *_ in PROCESSES
    ]}
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PD_DRY_RUN_INPUT": json.dumps(case),
           "PD_TEST_FROM_POD": "from-pod"}
    if release_dir:
        env["PYTHONPATH"] = release_dir
    with tempfile.NamedTemporaryFile("r", suffix=".json") as verdict_file:
        done = subprocess.run([python, SHIM, "--input-env", "PD_DRY_RUN_INPUT", "--verdict", verdict_file.name],
                              env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            sys.exit(f"shim exited {done.returncode}: {done.stderr[-2000:]}")
        full = json.loads(done.stdout.strip().splitlines()[-1])
        compact = verdict_file.read()
    assert len(compact.encode()) <= 4096, f"the termination message is {len(compact.encode())} bytes"
    return full, json.loads(compact)


def model_dir_of(config):
    model_dir = tempfile.mkdtemp(prefix="pd-dry-run-model-")
    with open(os.path.join(HERE, "configs", f"{config}.json")) as src, open(os.path.join(model_dir, "config.json"), "w") as dst:
        dst.write(src.read())
    return model_dir


def handshake_problems(release, full, compact, python, release_dir):
    """The first pair passed its start-up: the release's handshake judged it (from 0.5.21) with a
    rank map, or said plainly that it could not; each refused pair gets SGLang's own text."""
    shake, problems = full.get("handshake") or {}, []
    if tuple(int(x) for x in release.split(".")) < HANDSHAKE_FROM:
        if shake.get("ran") is not False or not shake.get("note"):
            problems.append(f"SGLang {release} has no launcher placement, yet the handshake says {shake}")
        return problems
    if not (shake.get("ran") and shake.get("ok")):
        problems.append(f"handshake of the passing pair: {shake}")
    elif [r["tp"] for r in shake.get("rank_map", [])] != [[0], [1]]:
        problems.append(f"rank map {shake.get('rank_map')}, want decode ranks 0, 1 pulling prefill ranks [0], [1]")
    for config, pre, dec, stage, text in HANDSHAKES:
        procs = [{"role": role, "node": 0, "profile": "H100", "argv": argv(role, extra), "env": []}
                 for role, extra in (("prefill", pre), ("decode", dec))]
        got, small = run(python, release_dir, model_dir_of(config), procs)
        shake = got.get("handshake") or {}
        print(f"[dry-run shim] SGLang {release} handshake {config} {pre} -> {dec}: ok={shake.get('ok')} "
              f"stage={shake.get('stage')} {shake.get('error')}", file=sys.stderr)
        if not all(p["ok"] for p in got["processes"]):
            problems.append(f"{config}: a process of the pair did not start: {got['processes']}")
        if got["ok"] or small["ok"] or shake.get("stage") != stage or text not in (shake.get("error") or ""):
            problems.append(f"{config}: want the handshake refused at {stage} with {text!r}, got {shake}")
        if text not in ((small.get("handshake") or {}).get("error") or ""):
            problems.append(f"{config}: the termination message lost the handshake's text")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--release-dir")
    ap.add_argument("--expect-version", required=True)
    args = ap.parse_args()
    model_dir = model_dir_of("Qwen3ForCausalLM")
    full, compact = run(args.python, args.release_dir, model_dir)
    problems = []
    if full["sglang"] != args.expect_version:
        problems.append(f"ran SGLang {full['sglang']}, not {args.expect_version}")
    if full["ok"] or compact["ok"]:
        problems.append("the verdict passes a refused process")
    for want, got, small in zip(PROCESSES, full["processes"], compact["processes"]):
        role, node, profile, _, ok, stage, text = want
        print(f"[dry-run shim] SGLang {full['sglang']} {role}/{node} on {profile}: ok={got['ok']} stage={got.get('stage')} "
              f"{got.get('error_type') or ''} {(got.get('error') or '')[:160]}", file=sys.stderr)
        where = f"{role}/{node}"
        if (got["role"], got["node"], got["profile"]) != (role, node, profile) or small["role"] != role:
            problems.append(f"{where}: the verdict is out of order")
        if got["ok"] != ok or small["ok"] != ok:
            problems.append(f"{where}: ok={got['ok']}, want {ok}")
        if ok and got["resolved"].get("page_size") != 64:
            problems.append(f"{where}: resolved page_size {got['resolved'].get('page_size')}, want 64")
        if stage and got.get("stage") != stage:
            problems.append(f"{where}: stage {got.get('stage')}, want {stage}")
        if not ok and not got.get("error"):
            problems.append(f"{where}: no SGLang text")
        if text and text not in got.get("error", ""):
            problems.append(f"{where}: SGLang's text {got.get('error')!r} lacks {text!r}")
    problems += handshake_problems(args.expect_version, full, compact, args.python, args.release_dir)
    if problems:
        sys.exit("[dry-run shim] " + "; ".join(problems))
    print(f"[dry-run shim] SGLang {full['sglang']}: every verdict is SGLang's own", file=sys.stderr)


if __name__ == "__main__":
    main()
