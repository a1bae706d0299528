"""The engine tier (docs/engine-on-cpu.md): real SGLang 0.5.23 prefill and decode on a CPU-only host.

Starts each engine with the argv `pd-operator render` wrote into the pod (its `engine` container),
changing only what one host needs (ports, host, model directory) and adding the CPU switches named
in CPU_SWITCHES; the decode's handshake sidecar runs as rendered (its decode.json from the rendered
ConfigMap) against the real prefill's bootstrap server, and smg (PyPI `smg`, the pinned router) is
put in front once the sidecar's gate opens. Run by hack/e2e-engine.sh with the engine venv's python
(PD_OPERATOR_BIN and SMG_PYTHON in the environment); exits non-zero with the logs' tails when a
check fails.

  run.py serve  RENDERED.yaml  # requests by token ids and by chat through smg, each answered by the
                               # decode with the prompt's KV moved from the prefill over Mooncake TCP
  run.py seed   RENDERED.yaml  # decode --dcp-size 2 on a GQA model: SGLang's own error at the first
                               # request; on a CPU host SGLang refuses DCP at start-up first (CPU_DCP_WALL);
                               # the sidecar, given the same decode, refuses it against the real prefill
"""

from __future__ import annotations

import json
import os
import random
import re
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
    "--context-length", "256",
    "--max-total-tokens", "2048",           # a tiny KV pool instead of a fraction of host memory
    "--mem-fraction-static", "0.05",
    "--dtype", "float32",                   # TP layouts then agree to rounding (the token check below)
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
    # No NCCL for tp > 1: the CUDA torch wheel brings libnccl, so SGLang's PyNccl binds its TP
    # group to a CUDA device ("ValueError: Expected a cuda device, but got: cpu",
    # sglang/srt/distributed/device_communicators/pynccl.py:116). SGLang's own knob for the
    # library's path, pointed at none, gives what a CPU-only torch has: PyNccl disabled ("missing
    # NCCL library, e.g. in a non-GPU environment", pynccl.py:72-77), the TP group on gloo.
    "SGLANG_NCCL_SO_PATH": "libnccl-not-on-this-cpu-host.so",
}


def handshake_decode(rendered: Path) -> dict:
    """The decode.json of the rendered handshake ConfigMap: what the sidecar knows of its decode."""
    for doc in yaml.safe_load_all(rendered.read_text()):
        if doc and doc.get("kind") == "ConfigMap" and "decode.json" in (doc.get("data") or {}):
            return json.loads(doc["data"]["decode.json"])
    sys.exit(f"{rendered}: no handshake ConfigMap with a decode.json")


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


def tp_size(argv: list[str]) -> int:
    return int(argv[argv.index("--tp-size") + 1])


def omp_threads_bind(argv: list[str]) -> dict[str, str]:
    """More ranks than NUMA nodes need each rank's cores named (sglang/srt/utils/numa_utils.py:463:
    "SGLANG_CPU_OMP_THREADS_BIND is not set, in this case, the total number of ranks ... should be
    smaller than or equal to number of numa node"): the host's cores dealt round-robin to the ranks."""
    tp = tp_size(argv)
    if tp == 1:
        return {}
    cores = os.cpu_count() or 1
    ranks = [sorted({c for c in range(cores) if c % tp == r} or {r % cores}) for r in range(tp)]
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, r)) for r in ranks)}


class Engine:
    """A process of the tier (an engine, the sidecar, the router) with its log in the log dir."""

    def __init__(self, name: str, argv: list[str], port: int, logdir: Path, env: dict | None = None):
        self.name, self.port, self.log = name, port, logdir / f"{name}.log"
        self.argv = argv
        env = {**os.environ, **(CPU_ENV | omp_threads_bind(argv) if env is None else env)}
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True, cwd=logdir,
        )

    def get(self, path: str) -> tuple[int | None, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")
        except OSError as err:
            return None, repr(err)

    def healthy(self) -> bool:
        return self.get("/health")[0] == 200

    def poll(self, path: str, accept, timeout: float, waiting_for: str) -> tuple[float, int | None, str]:
        """GET `path` until `accept(status)`: the seconds it took and the answer, or RuntimeError
        naming what was waited for and the last answer."""
        t0, last = time.time(), (None, "")
        while time.time() - t0 < timeout:
            last = self.get(path)
            if accept(last[0]):
                return time.time() - t0, *last
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: {waiting_for} not seen in {timeout:.0f}s (last: {last})\n{self.tail()}")

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
CHAT = {"messages": [{"role": "user", "content": "Which prefill rank sent my KV?"}],
        "max_tokens": 8, "temperature": 0}
# The control: PROMPT's ids reversed (same length), sent to the prefill while the decode gets PROMPT.
OTHER = {**PROMPT, "input_ids": PROMPT["input_ids"][::-1]}
PORTS = {"prefill": 31100, "decode": 31200, "plain": 31300, "sidecar": 31400, "smg": 31500, "smg-metrics": 31501}
BOOT = 18998
GATE_TIMEOUT_S = 120  # the sidecar's retry delays top out well below this


def local_model(model: Path, out: Path) -> Path:
    """The tiny model as a checkpoint on disk: its config.json, random weights of our own (seeded,
    written by transformers as one safetensors file, so every TP layout loads the same weights,
    which SGLang's per-shard dummy weights are not) and a tokenizer of ours."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(model))
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(out))
    text = (model / "config.json").read_text()
    (out / "config.json").write_text(text)
    with_tokenizer(json.loads(text), out)
    return out


def with_tokenizer(cfg: dict, out: Path) -> None:
    """A tokenizer of ours, so chat works offline: byte-level BPE without merges (one token per
    byte, GPT-2's alphabet after the ids the config gives <s> and </s>), padded with plain tokens
    to the config's vocab_size, and a chat template. SGLang loads it with transformers'
    AutoTokenizer like any Hub tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    special = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: the config's bos_token_id and eos_token_id
    vocab = special + sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab += [f"<t{i}>" for i in range(cfg["vocab_size"] - len(vocab))]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special)
    tok.save(str(out / "tokenizer.json"))
    template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 256, "chat_template": template}))


def post(port: int, path: str, body: dict) -> tuple[int | None, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return None, repr(err)


def pd_request(prefill: Engine, decode: Engine, prefill_prompt: dict = PROMPT, decode_prompt: dict = PROMPT) -> dict:
    """What SGLang's mini-LB does: one body with one bootstrap room to both; the decode answers.
    Different prompts to the two (same length) pair the decode's request with another prompt's KV."""
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT, "bootstrap_room": random.randrange(1 << 62)}
    bodies = {prefill.name: {**prefill_prompt, **boot}, decode.name: {**decode_prompt, **boot}}
    out: dict[str, tuple[int | None, str]] = {}
    threads = [threading.Thread(target=lambda e=e: out.__setitem__(e.name, post(e.port, "/generate", bodies[e.name])))
               for e in (prefill, decode)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


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


def sidecar_argv(decode_json: Path, *extra: str) -> list[str]:
    """The rendered sidecar's argv on loopback: --prefill for the rendered --prefill-file (whose
    address is the prefill's Service name) and no --pod (no Kubernetes to report the gate to)."""
    return [os.environ["PD_OPERATOR_BIN"], "handshake", "run", "--decode", str(decode_json),
            "--prefill", f"127.0.0.1:{BOOT}", *extra]


def start_sidecar(decode: dict, logdir: Path) -> Engine:
    f = logdir / "decode.json"
    f.write_text(json.dumps(decode))
    argv = sidecar_argv(f, "--listen", f"127.0.0.1:{PORTS['sidecar']}")
    return Engine("sidecar", argv, PORTS["sidecar"], logdir, env={})


def start_router(logdir: Path) -> Engine:
    """smg in PD mode in front of both engines, as the rendered router runs it but with static URLs
    for the discovery of Ready pods (the gate above is what makes the decode Ready)."""
    argv = [os.environ["SMG_PYTHON"], "-m", "smg.launch_router", "--pd-disaggregation",
            "--prefill", f"http://127.0.0.1:{PORTS['prefill']}", str(BOOT),
            "--decode", f"http://127.0.0.1:{PORTS['decode']}",
            "--host", "127.0.0.1", "--port", str(PORTS["smg"]), "--prometheus-port", str(PORTS["smg-metrics"])]
    return Engine("smg", argv, PORTS["smg"], logdir, env={})


def through_router(router: Engine, path: str, body: dict) -> tuple[float, int | None, str]:
    """The first answer smg gives once it has activated both workers, and its latency."""
    t0 = time.time()
    while True:
        t = time.time()
        status, text = post(router.port, path, body)
        if status == 200 or time.time() - t0 > 90:
            return time.time() - t, status, text
        time.sleep(1)


def stop_all(procs: list[Engine]) -> None:
    for e in procs:
        e.stop()


def role_argvs(argvs: dict, model: Path, python: str, dcp: str | None = None) -> tuple[list[str], list[str]]:
    """The prefill's and the decode's rendered argv on this host (the decode's --dcp-size set to
    `dcp` where admission is bypassed), printed."""
    prefill_argv = local_argv(argvs["prefill"], python, model, PORTS["prefill"], BOOT)
    decode_argv = local_argv(argvs["decode"], python, model, PORTS["decode"], BOOT + 1) + DECODE_CPU_SWITCHES
    if dcp is not None:
        decode_argv = set_flag(decode_argv, "--dcp-size", dcp)
    print("prefill:", " ".join(prefill_argv[1:]), "\ndecode: ", " ".join(decode_argv[1:]), flush=True)
    return prefill_argv, decode_argv


def serve(argvs: dict, decode: dict, model: Path, python: str, logdir: Path) -> None:
    model = local_model(model, logdir / "model")
    prefill_argv, decode_argv = role_argvs(argvs, model, python)
    sidecar = start_sidecar(decode, logdir)
    procs = [sidecar]
    try:
        closed = sidecar.poll("/readyz", lambda st: st is not None, 30, "a first answer on /readyz")[1:]
        procs += [Engine("prefill", prefill_argv, PORTS["prefill"], logdir),
                  Engine("decode", decode_argv, PORTS["decode"], logdir)]
        # The same weights without PD, laid out as the decode's: its tokens are what the decode
        # must produce, which it does only if the prompt's KV arrived from the prefill intact.
        plain_argv = local_argv(argvs["decode"], python, model, PORTS["plain"], BOOT + 2)
        plain_argv = set_flag(plain_argv, "--disaggregation-mode", "null")
        procs.append(Engine("plain", plain_argv, PORTS["plain"], logdir))
        started = wait_healthy(procs[1:])
        # The decode pod's readiness gate opens: /readyz 200.
        gate_s, _, opened = sidecar.poll("/readyz", lambda st: st == 200, GATE_TIMEOUT_S, "/readyz 200")
        verdict = json.loads(sidecar.get("/status")[1])["prefill"][0]["verdict"]
        mem = rss_mb(procs[1:])
        router = start_router(logdir)
        procs.append(router)
        tokens_s, status, text = through_router(router, "/generate", PROMPT)
        out = {"router": (status, text), "plain": post(PORTS["plain"], "/generate", PROMPT)}
        served = json.loads(procs[2].get("/v1/models")[1])["data"][0]["id"]  # the decode's model id
        chat_s, *chat = through_router(router, "/v1/chat/completions", {**CHAT, "model": served})
        out["chat"] = tuple(chat)
        out["plain_other"] = post(PORTS["plain"], "/generate", OTHER)
        out["swapped"] = pd_request(procs[1], procs[2], OTHER, PROMPT)["decode"]
        time.sleep(MOONCAKE_METRIC_INTERVAL_S + 1)  # one report of Mooncake's metric thread
        report = {"startup_s": round(started, 1), "gate_closed_before": closed, "gate_open_after_s": round(gate_s, 1),
                  "gate": opened.strip(), "rank_map": verdict.get("ranks"), "generate_s": round(tokens_s, 2),
                  "chat_s": round(chat_s, 2), "rss_mb": mem, "responses": out}
        print(json.dumps(report, indent=1), flush=True)
        print_mooncake_metrics(procs[1:3])
        check_serve(report, prefill_argv, procs)
    finally:
        stop_all(procs)


def print_mooncake_metrics(engines: list[Engine]) -> None:
    for e in engines:
        for line in e.log.read_text(errors="replace").splitlines():
            if "transfer_engine_impl" in line and ("etric" in line or "hroughput" in line):
                print(f"  {e.name}| {line[:300]}")


# Mooncake's metric line, one per transfer engine (one per rank) every 5 s, in glog's format:
# "I1206 03:23:59.072732 32195 transfer_engine_impl.cpp:1128] [Metrics] ... Throughput: 0.01 MB/s".
MOONCAKE_METRIC = re.compile(r"^I\d{4} \S+ +(\d+) transfer_engine_impl\.cpp:\d+\] \[Metrics\].*Throughput: ([\d.]+) MB/s")


def mooncake_senders(log: str) -> set[str]:
    """The prefill's transfer engines (by glog thread id) whose metric reported bytes moved. Each
    rank's share of the tiny prompt's KV (a 64-token page: 2 layers x K and V x its KV heads x 32 x
    4 bytes, 32 KiB per rank at tp 2) shows as 0.01 MB/s in the 5 s window holding the transfer."""
    return {m[1] for m in map(MOONCAKE_METRIC.match, log.splitlines()) if m and float(m[2]) > 0}


def check_serve(report: dict, prefill_argv: list[str], procs: list[Engine]) -> None:
    logs = "\n".join(e.tail(60) for e in procs)
    if report["gate_closed_before"][0] != 503:
        raise RuntimeError(f"the sidecar's gate was not closed before the prefill registered: {report['gate_closed_before']}\n{logs}")
    prefill_tp = tp_size(prefill_argv)
    # Between them the decode's ranks need every prefill rank (each holds some of the KV heads).
    named = {r for m in report["rank_map"] or [] for r in m["target_tp_ranks"]}
    if named != set(range(prefill_tp)):
        raise RuntimeError(f"the sidecar's rank map {report['rank_map']} does not name the prefill's {prefill_tp} rank(s)\n{logs}")
    status, text = report["responses"]["router"]
    if status != 200:
        raise RuntimeError(f"smg did not answer the request by token ids: {status} {text[:500]}\n{logs}")
    tokens = json.loads(text)["output_ids"]
    plain_status, plain_text = report["responses"]["plain"]
    expected = json.loads(plain_text)["output_ids"] if plain_status == 200 else None
    if tokens != expected:
        raise RuntimeError(f"decode tokens {tokens} differ from the plain engine's {expected} "
                           f"({plain_status}): the prompt's KV did not arrive intact\n{logs}")
    check_swapped(report["responses"], tokens, logs)
    chat_status, chat_text = report["responses"]["chat"]
    usage = json.loads(chat_text).get("usage", {}) if chat_status == 200 else {}
    if chat_status != 200 or not usage.get("completion_tokens"):
        raise RuntimeError(f"smg did not answer the chat request: {chat_status} {chat_text[:500]}\n{logs}")
    prefill_log = procs[1].log.read_text(errors="replace")
    if "TcpTransport" not in prefill_log:
        raise RuntimeError(f"the prefill's Mooncake transfer engine did not use TCP\n{logs}")
    senders = mooncake_senders(prefill_log)
    if len(senders) != prefill_tp:
        raise RuntimeError(f"{len(senders)} of the prefill's {prefill_tp} rank(s) moved bytes by Mooncake's own "
                           f"metric; the rank map names {sorted(named)}\n{logs}")
    print(f"PASS serve: the sidecar's gate opened on the real prefill (rank map {report['rank_map']}); "
          f"through smg the decode's {len(tokens)} tokens equal the plain engine's (the prompt's KV came from "
          f"prefill rank(s) {sorted(named)} over Mooncake TCP; given another prompt's KV it continues that prompt) "
          f"and a chat request got {usage['completion_tokens']} tokens")


def check_swapped(out: dict, tokens: list[int], logs: str) -> None:
    """The control of the token check: the decode given PROMPT with the KV the prefill computed for
    OTHER continues OTHER (the plain engine's tokens for OTHER), not PROMPT, so its tokens come
    from the KV that moved and the equality above can fail."""
    other = [json.loads(t)["output_ids"] if s == 200 else (s, t[:300]) for s, t in (out["plain_other"], out["swapped"])]
    if other[0] == tokens or other[1] != other[0]:
        raise RuntimeError(f"control: with OTHER's KV the decode gave {other[1]}; the plain engine gives "
                           f"{other[0]} for OTHER and {tokens} for PROMPT\n{logs}")


def seed(argvs: dict, decode: dict, model: Path, python: str, logdir: Path) -> None:
    model = local_model(model, logdir / "model")
    # Admission bypassed: the rendered (valid) decode with the mistake the webhook refuses, and the
    # sidecar told the same.
    prefill_argv, decode_argv = role_argvs(argvs, model, python, dcp="2")
    decode = {**decode, "dcp_size": 2}
    prefill = Engine("prefill", prefill_argv, PORTS["prefill"], logdir)
    dec = Engine("decode", decode_argv, PORTS["decode"], logdir)
    try:
        wait_healthy([prefill])
        sidecar_refuses(decode, logdir)
        try:
            wait_healthy([dec])
        except RuntimeError:
            if CPU_DCP_WALL not in dec.log.read_text(errors="replace"):
                raise
            print(f"PASS seed (CPU wall): the decode with --dcp-size 2 exits at start-up with SGLang's "
                  f"'{CPU_DCP_WALL} on the AMD HIP, CUDA, NPU, or Intel XPU platform': '{SEED_ERROR}' "
                  f"(first request) is not reachable on a CPU host; the sidecar refused it against the real "
                  f"prefill with '{SEED_ERROR}'")
            return
        out = pd_request(prefill, dec)
        status, text = out["decode"]
        if status == 200 or not (SEED_ERROR in text or SEED_ERROR in dec.log.read_text(errors="replace")):
            raise RuntimeError(f"expected SGLang's '{SEED_ERROR}', got {status} {text[:500]}\n{dec.tail(60)}")
        print(f"PASS seed: the real decode raised '{SEED_ERROR}' at the first request, as the sidecar said")
    finally:
        stop_all([prefill, dec])


def sidecar_refuses(decode: dict, logdir: Path) -> None:
    """`handshake run --once` on the seed's decode against the real prefill: refused, SGLang's text."""
    f = logdir / "decode-dcp2.json"
    f.write_text(json.dumps(decode))
    o = subprocess.run(sidecar_argv(f, "--once", "--timeout", "60s"), capture_output=True, text=True)
    (logdir / "sidecar-once.json").write_text(o.stdout + o.stderr)
    if o.returncode == 0 or SEED_ERROR not in o.stdout:
        raise RuntimeError(f"the sidecar did not refuse the seed with '{SEED_ERROR}' ({o.returncode}): {o.stdout[:800]} {o.stderr[-800:]}")


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] not in ("serve", "seed"):
        sys.exit("usage: run.py serve|seed RENDERED.yaml MODEL_DIR PYTHON LOGDIR")
    mode, rendered, model, python, logdir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    try:
        (serve if mode == "serve" else seed)(engine_argvs(rendered), handshake_decode(rendered), model, python, logdir)
    except RuntimeError as err:
        sys.exit(f"FAIL {mode}: {err}")
