"""Runs pieces of the installed SGLang 0.5.23 wheel without its GPU stack, for interop tests.

The classes are loaded from the wheel's own source file (sglang/srt/disaggregation/common/conn.py):
the file is parsed, the three classes the bootstrap protocol needs are compiled from it with the
few names they use, and nothing of SGLang is copied here.

  serve PORT            run SGLang's CommonKVBootstrapServer on 127.0.0.1:PORT; prints "ready"
  decode-fetch ADDR     the decode's topology fetch against ADDR: GET /route with four -1, then
                        PrefillServerInfo(**data); prints {"status", "body", "record"|"error"}
"""

import __future__
import ast
import asyncio
import dataclasses
import importlib.util
import json
import logging
import pathlib
import sys
import threading
import time
import types
import typing
import urllib.error
import urllib.request

from aiohttp import web

WANTED = ("PrefillServerInfo", "PrefillRankInfo", "CommonKVBootstrapServer")


class _Env:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class _Envs:
    SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL = _Env(120)


def load_sglang_classes():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglang is not installed in this interpreter")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    source_path = root / "srt" / "disaggregation" / "common" / "conn.py"
    tree = ast.parse(source_path.read_text(), filename=str(source_path))
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in WANTED]
    missing = set(WANTED) - {c.name for c in classes}
    if missing:
        sys.exit(f"{source_path} lacks {sorted(missing)}")
    module = ast.Module(body=classes, type_ignores=[])
    namespace = {
        "__name__": "sglang_interop",
        "asyncio": asyncio,
        "dataclasses": dataclasses,
        "logging": logging,
        "threading": threading,
        "time": time,
        "web": web,
        "envs": _Envs,
        "logger": logging.getLogger("sglang_interop"),
        "BaseKVBootstrapServer": object,
    }
    namespace.update({name: getattr(typing, name) for name in typing.__all__})
    # conn.py defers annotations (`from __future__ import annotations`); compile the same way.
    code = compile(module, str(source_path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    module_object = types.ModuleType("sglang_interop")
    module_object.__dict__.update(namespace)
    sys.modules["sglang_interop"] = module_object  # dataclasses looks the module up
    exec(code, module_object.__dict__)
    return module_object.__dict__


def serve(port):
    ns = load_sglang_classes()
    ns["CommonKVBootstrapServer"]("127.0.0.1", port)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def decode_fetch(addr):
    ns = load_sglang_classes()
    url = f"http://{addr}/route?prefill_dp_rank={-1}&prefill_cp_rank={-1}&target_tp_rank={-1}&target_pp_rank={-1}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    out = {"status": status, "body": body}
    if status == 200:
        try:
            record = ns["PrefillServerInfo"](**json.loads(body))
            out["record"] = dataclasses.asdict(record)
        except Exception as e:  # the decode logs exactly this and retries
            out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "decode-fetch":
        decode_fetch(sys.argv[2])
    else:
        sys.exit(__doc__)
