"""Writes an SGLang release's `sglang serve` option strings and their argparse destinations, one
`--option dest` per line: src/core/sglang_flags/<release>.txt, which validate matches extraArgs
against the way argparse does (exact, then unique prefix). Run with the oracle venv's python,
another release's unpacked wheel first on PYTHONPATH (hack/sglang-release.sh prints its path):
  PYTHONPATH=$(hack/sglang-release.sh 0.5.21) $(hack/sglang-oracle-venv.sh | tail -n1) \
    tests/parity/dump_flags.py > src/core/sglang_flags/0.5.21.txt
"""

import argparse

from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
assert parser.allow_abbrev
print(f"# sglang {__version__} `sglang serve` options: option dest (tests/parity/dump_flags.py)")
for option, dest in sorted({(o, a.dest) for a in parser._actions for o in a.option_strings if o.startswith("--")}):
    print(option, dest)
