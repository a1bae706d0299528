"""The engine tier (docs/engine-on-cpu.md): real SGLang 0.5.23 prefill and decode on a CPU-only host.

Starts each engine with the argv `pd-operator render` wrote into the pod (its `engine` container),
changing only what one host needs (ports, host, model directory) and adding the CPU switches named
in CPU_SWITCHES, then sends one request the way SGLang's mini-LB does: the same body, with one
bootstrap room, to the prefill and the decode. Run by hack/e2e-engine.sh with the engine venv's
python; exits non-zero with the engines' logs' tails when a check fails.

  run.py serve  RENDERED.yaml  # a request is answered, its KV moved prefill -> decode over Mooncake TCP
  run.py seed   RENDERED.yaml  # decode --dcp-size 2 on a GQA model: SGLang's own error at the first
                               # request; on a CPU host SGLang refuses DCP at start-up first (CPU_DCP_WALL)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
SEED_ERROR = "PD decode DCP requires an MLA or hybrid-MLA KV pool."
# sglang/srt/distributed/parallel_state.py:2656-2662: before any request, on a CPU platform.
CPU_DCP_WALL = "Decode context parallel (decode_context_parallel_size > 1) is currently only supported"
START_TIMEOUT_S = float(os.environ.get("PD_ENGINE_START_TIMEOUT", "900"))
MOONCAKE_METRIC_INTERVAL_S = 5  # "Metrics reporting thread started (interval: 5s)"
REQUEST_TIMEOUT_S = float(os.environ.get("PD_ENGINE_REQUEST_TIMEOUT", "300"))

# Every switch added to the rendered argv, and why (docs/engine-on-cpu.md has the errors they fix).
CPU_SWITCHES = [
    "--device", "cpu",                      # no GPU here; SGLANG_USE_CPU_ENGINE=1 picks the CPU platform
    "--attention-backend", "torch_native",  # the CUDA attention backends do not run on a CPU
    "--load-format", "dummy",               # random weights: the tiny model ships only a config.json
    "--skip-tokenizer-init",                # no tokenizer offline: requests carry input_ids
    "--context-length", "256",
    "--max-total-tokens", "2048",           # a tiny KV pool instead of a fraction of host memory
    "--mem-fraction-static", "0.05",
    "--dtype", "bfloat16",
]
# The decode's inferred retraction backup (host_pool) registers its host buffer with
# cudaHostRegister (sglang/srt/mem_cache/pool_host/common.py:147), which needs an NVIDIA driver.
DECODE_CPU_SWITCHES = ["--disaggregation-decode-retraction-backup", "none"]
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # SGLang's CPU platform (sglang/srt/platforms/__init__.py:50)
    "MOONCAKE_PROTOCOL": "tcp",    # Mooncake over TCP: no RDMA device here
    "SGLANG_HOST_IP": "127.0.0.1", # what the pod gets from status.podIP
    "PYTHONPATH": str(SHIM),       # tests/engine/shim: sgl_kernel and CUDA-event stand-ins
    "MC_TE_METRIC": "1",           # Mooncake's transfer engine logs its throughput
}


def engine_argvs(rendered: Path) -> dict[str, list[str]]:
    """role -> the engine container's argv in the rendered pod of that role (first pod of each)."""
    out: dict[str, list[str]] = {}
    for doc in yaml.safe_load_all(rendered.read_text()):
        if not doc or doc.get("kind") != "Pod":
            continue
        role = doc["metadata"]["labels"].get("pd.inference.dev/role")
        for c in doc["spec"]["containers"]:
            if c["name"] == "engine" and role and role not in out:
                out[role] = c.get("command", []) + c.get("args", [])
    if set(out) != {"prefill", "decode"}:
        sys.exit(f"{rendered}: expected a prefill and a decode engine pod, found {sorted(out)}")
    return out


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    if flag not in argv:
        sys.exit(f"rendered argv has no {flag}: {argv}")
    i = argv.index(flag)
    return argv[: i + 1] + [value] + argv[i + 2 :]


def local_argv(argv: list[str], python: str, model: Path, port: int, boot: int) -> list[str]:
    """The rendered argv on one host: this python, the model directory, loopback, own ports."""
    if argv[:3] != ["python3", "-m", "sglang.launch_server"]:
        sys.exit(f"unexpected engine command: {argv[:3]}")
    argv = [python, "-W", "ignore"] + argv[1:]
    argv = set_flag(argv, "--model-path", str(model))
    argv = set_flag(argv, "--host", "127.0.0.1")
    argv = set_flag(argv, "--port", str(port))
    return set_flag(argv, "--disaggregation-bootstrap-port", str(boot)) + CPU_SWITCHES


def omp_threads_bind(argv: list[str]) -> dict[str, str]:
    """More ranks than NUMA nodes need each rank's cores named (sglang/srt/utils/numa_utils.py:463:
    "SGLANG_CPU_OMP_THREADS_BIND is not set, in this case, the total number of ranks ... should be
    smaller than or equal to number of numa node"): the host's cores dealt round-robin to the ranks."""
    tp = int(argv[argv.index("--tp-size") + 1])
    if tp == 1:
        return {}
    cores = os.cpu_count() or 1
    ranks = [sorted({c for c in range(cores) if c % tp == r} or {r % cores}) for r in range(tp)]
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, r)) for r in ranks)}


class Engine:
    def __init__(self, name: str, argv: list[str], port: int, logdir: Path):
        self.name, self.port, self.log = name, port, logdir / f"{name}.log"
        self.argv = argv
        env = {**os.environ, **CPU_ENV, **omp_threads_bind(argv)}
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True, cwd=logdir,
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def tail(self, n: int = 25) -> str:
        lines = [l for l in self.log.read_text(errors="replace").splitlines()
                 if "server_args=" not in l and "warn" not in l.lower()]
        return "\n".join(f"  {self.name}| {l[:300]}" for l in lines[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def wait_healthy(engines: list[Engine]) -> float:
    t0 = time.time()
    while time.time() - t0 < START_TIMEOUT_S:
        for e in engines:
            if e.proc.poll() is not None:
                raise RuntimeError(f"{e.name} exited ({e.proc.returncode}) while starting:\n{e.tail()}")
        if all(e.healthy() for e in engines):
            return time.time() - t0
        time.sleep(2)
    raise RuntimeError(f"engines not healthy after {START_TIMEOUT_S}s:\n" + "\n".join(e.tail() for e in engines))


PROMPT = {
    "input_ids": [1, 5, 9, 17, 33, 65, 129, 257, 3, 7, 11, 13],
    "sampling_params": {"max_new_tokens": 8, "temperature": 0},
}


def generate(e: Engine, body: dict) -> tuple[int | None, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{e.port}/generate", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return None, repr(err)


def plain_request(e: Engine) -> tuple[int | None, str]:
    return generate(e, PROMPT)


def pd_request(prefill: Engine, decode: Engine, boot_port: int) -> tuple[float, dict]:
    """What SGLang's mini-LB does: one body with one bootstrap room to both; the decode answers."""
    body = {**PROMPT, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot_port,
            "bootstrap_room": random.randrange(1 << 62)}
    out: dict[str, tuple[int | None, str]] = {}

    def post(e: Engine) -> None:
        out[e.name] = generate(e, body)

    t0 = time.time()
    threads = [threading.Thread(target=post, args=(e,)) for e in (prefill, decode)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - t0, out


def rss_mb(engines: list[Engine]) -> int:
    """Resident memory of the engines' process trees (ps), in MB."""
    ps = subprocess.run(["ps", "-eo", "pid,ppid,rss"], capture_output=True, text=True).stdout.split("\n")[1:]
    rows = [tuple(map(int, l.split())) for l in ps if l.strip()]
    roots = {e.proc.pid for e in engines}
    tree, grew = set(roots), True
    while grew:
        new = {pid for pid, ppid, _ in rows if ppid in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(rss for pid, _, rss in rows if pid in tree) // 1024


def run(mode: str, rendered: Path, model: Path, python: str, logdir: Path) -> None:
    argvs = engine_argvs(rendered)
    boot = 18998
    prefill_argv = local_argv(argvs["prefill"], python, model, 31100, boot)
    decode_argv = local_argv(argvs["decode"], python, model, 31200, boot + 1) + DECODE_CPU_SWITCHES
    if mode == "seed":
        # Admission bypassed: the rendered (valid) decode argv with the mistake the webhook refuses.
        decode_argv = set_flag(decode_argv, "--dcp-size", "2")
    print("prefill:", " ".join(prefill_argv[1:]), "\ndecode: ", " ".join(decode_argv[1:]), flush=True)
    prefill = Engine("prefill", prefill_argv, 31100, logdir)
    decode = Engine("decode", decode_argv, 31200, logdir)
    engines = [prefill, decode]
    if mode == "serve":
        # The same weights (dummy weights are seeded) without PD: its tokens are what the decode
        # must produce, which it does only if the prompt's KV arrived from the prefill intact.
        plain_argv = set_flag(prefill_argv, "--disaggregation-mode", "null")
        engines.append(Engine("plain", set_flag(plain_argv, "--port", "31300"), 31300, logdir))
    try:
        try:
            started = wait_healthy(engines)
        except RuntimeError:
            if mode == "seed" and CPU_DCP_WALL in decode.log.read_text(errors="replace"):
                print(f"PASS seed (CPU wall): the decode with --dcp-size 2 exits at start-up with "
                      f"SGLang's '{CPU_DCP_WALL} on the AMD HIP, CUDA, NPU, or Intel XPU platform': "
                      f"'{SEED_ERROR}' (first request) is not reachable on a CPU host")
                return
            raise
        mem = rss_mb(engines)
        seconds, out = pd_request(prefill, decode, boot)
        if mode == "serve":
            out["plain"] = plain_request(engines[2])
            time.sleep(MOONCAKE_METRIC_INTERVAL_S + 1)  # one report of Mooncake's metric thread
        report = {"mode": mode, "startup_s": round(started, 1), "request_s": round(seconds, 2),
                  "rss_mb": mem, "responses": out}
        print(json.dumps(report, indent=1), flush=True)
        for e in engines[:2]:
            for line in e.log.read_text(errors="replace").splitlines():
                if "transfer_engine_impl" in line and ("etric" in line or "hroughput" in line):
                    print(f"  {e.name}| {line[:300]}")
        check(mode, out, engines)
    finally:
        for e in engines:
            e.stop()


def logdir_of(engines: list[Engine]) -> Path:
    return engines[0].log.parent


def check(mode: str, out: dict, engines: list[Engine]) -> None:
    logs = "\n".join(e.tail(60) for e in engines)
    status, text = out.get("decode", (None, ""))
    if mode == "serve":
        if status != 200:
            raise RuntimeError(f"decode did not answer the request: {status} {text[:500]}\n{logs}")
        tokens = json.loads(text)["output_ids"]
        plain_status, plain_text = out["plain"]
        expected = json.loads(plain_text)["output_ids"] if plain_status == 200 else None
        if tokens != expected:
            raise RuntimeError(f"decode tokens {tokens} differ from the plain engine's {expected} "
                               f"({plain_status}): the prompt's KV did not arrive intact\n{logs}")
        if "TcpTransport" not in (logdir_of(engines) / "prefill.log").read_text(errors="replace"):
            raise RuntimeError(f"the prefill's Mooncake transfer engine did not use TCP\n{logs}")
        print(f"PASS serve: the decode's {len(tokens)} tokens equal the plain engine's: "
              "the prompt's KV came from the prefill over Mooncake TCP")
    else:
        seen = SEED_ERROR in text or any(SEED_ERROR in e.log.read_text(errors="replace") for e in engines)
        if status == 200 or not seen:
            raise RuntimeError(f"expected SGLang's '{SEED_ERROR}', got {status} {text[:500]}\n{logs}")
        print(f"PASS seed: the real decode raised '{SEED_ERROR}' at the first request")


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] not in ("serve", "seed"):
        sys.exit("usage: run.py serve|seed RENDERED.yaml MODEL_DIR PYTHON LOGDIR")
    try:
        run(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
    except RuntimeError as err:
        sys.exit(f"FAIL {sys.argv[1]}: {err}")
