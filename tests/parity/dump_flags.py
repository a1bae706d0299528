"""Writes an SGLang release's `sglang serve` option table, as its own argparse parser holds it:
src/core/sglang_flags/<release>.txt, which `validate` reads extraArgs with (option names exact or
as a unique prefix, and what argparse checks of their values). Run with the oracle venv's python,
another release's unpacked wheel first on PYTHONPATH (hack/sglang-release.sh prints its path):
  PYTHONPATH=$(hack/sglang-release.sh 0.5.21) $(hack/sglang-oracle-venv.sh | tail -n1) \
    tests/parity/dump_flags.py > src/core/sglang_flags/0.5.21.txt
The file's header says what each column holds.
"""

import argparse
import json

from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

HEADER = """\
# sglang {version} `sglang serve` options (tests/parity/dump_flags.py, from the release's argparse parser)
# One argparse action a line, in the order SGLang adds them (argparse lists an ambiguous prefix's
# matches in that order), whitespace-separated columns:
#   names   its option strings joined by `/` in SGLang's order (argparse names the option so in errors)
#   dest    the destination it sets
#   nargs   0: a switch, takes no value; 1: one value; ?: an optional value; *: any number; +: one or more
#   type    the conversion of each value: - (none), str, int, float, or the name of SGLang's converter
#           function (argparse's `invalid <name> value: ...` names it), e.g. human_readable_int, loads
# then, optionally:
#   choices=<JSON list>     the values argparse accepts after conversion, in the order its error lists them
#   choice-set=<JSON list>  the same, held by a Python set: sorted here; argparse lists a set in hash order
#   action=<name>           an action other than argparse's store / store_true / store_const / BooleanOptional:
#                           help (prints usage and exits), or SGLang's own class (e.g. LoRAPathAction)"""

PLAIN_ACTIONS = {"_StoreAction", "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "BooleanOptionalAction"}


def nargs_of(action):
    if action.nargs in (None, 0, "?", "*", "+"):
        return {None: "1", 0: "0"}.get(action.nargs, action.nargs)
    raise SystemExit(f"{action.option_strings}: nargs {action.nargs!r} is not one this table describes")


def type_of(action):
    if action.type is None:
        return "-"
    # argparse's own name for the conversion in `invalid %(type)s value`
    return getattr(action.type, "__name__", repr(action.type))


def choices_of(action):
    if action.choices is None:
        return []
    values = list(action.choices)
    assert not any(isinstance(v, str) and (not v or any(c.isspace() for c in v)) for v in values), action.choices
    if isinstance(action.choices, (set, frozenset)):
        return ["choice-set=" + json.dumps(sorted(values), separators=(",", ":"))]
    return ["choices=" + json.dumps(values, separators=(",", ":"))]


def action_of(action):
    name = type(action).__name__
    if name == "_HelpAction":
        return ["action=help"]
    return [] if name in PLAIN_ACTIONS else [f"action={name}"]


def main():
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    assert parser.allow_abbrev
    assert not [a for a in parser._actions if not a.option_strings], "sglang serve takes no positional argument"
    lines = []
    for action in parser._actions:
        assert all("/" not in o and " " not in o for o in action.option_strings)
        cols = ["/".join(action.option_strings), action.dest, nargs_of(action), type_of(action)]
        lines.append(" ".join(cols + choices_of(action) + action_of(action)))
    print(HEADER.format(version=__version__))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
