"""Writes SGLang 0.5.23's `sglang serve` option strings and their argparse destinations, one
`--option dest` per line: src/sglang_flags.txt, which the managed-flag rule matches extraArgs
against the way argparse does (exact, then unique prefix). Run with the oracle venv's python:
  $(hack/sglang-oracle-venv.sh | tail -n1) tests/parity/dump_flags.py > src/sglang_flags.txt
"""

import argparse
import importlib.metadata

from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
assert parser.allow_abbrev
print(f"# sglang {importlib.metadata.version('sglang')} `sglang serve` options: option dest (tests/parity/dump_flags.py)")
for option, dest in sorted({(o, a.dest) for a in parser._actions for o in a.option_strings if o.startswith("--")}):
    print(option, dest)
