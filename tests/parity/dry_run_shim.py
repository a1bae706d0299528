"""The engine dry run's shim (src/core/dryrun/shim.py) on one SGLang release, as the dry-run pod
runs it: the input in an environment variable, the verdict on stdout and, cut to a termination
message, in a file. Processes SGLang accepts, one whose extraArgs its parser refuses and one its
checks refuse after resolving, each on another accelerator profile; each must get SGLang's own
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
CONFIG = os.path.join(HERE, "configs", "Qwen3ForCausalLM.json")


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


def run(python, release_dir, model_dir):
    case = {"modelConfigDir": model_dir, "processes": [
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--release-dir")
    ap.add_argument("--expect-version", required=True)
    args = ap.parse_args()
    model_dir = tempfile.mkdtemp(prefix="pd-dry-run-model-")
    with open(CONFIG) as src, open(os.path.join(model_dir, "config.json"), "w") as dst:
        dst.write(src.read())
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
    if problems:
        sys.exit("[dry-run shim] " + "; ".join(problems))
    print(f"[dry-run shim] SGLang {full['sglang']}: every verdict is SGLang's own", file=sys.stderr)


if __name__ == "__main__":
    main()
