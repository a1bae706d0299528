"""A config.json for every architecture of an SGLang release's model registry, from config classes.

SGLang registers a model class by `EntryClass` in each `sglang/srt/models/*.py`. For each such
architecture this finds its Hugging Face `model_type` (transformers' auto-model name tables, else
an SGLang config class of the same stem in `sglang/srt/configs`), builds that config class with
its defaults, names the architecture in `architectures`, and writes one JSON line:
  {"arch": str, "file": "models/x.py", "model_type": str|null, "source": "transformers"|"sglang"|null,
   "config": {...}|null, "why": str|null}
Run with the oracle venv's python (another release's unpacked wheel first on PYTHONPATH):
  $(hack/sglang-oracle-venv.sh | tail -n1) tests/parity/registry_configs.py > configs.jsonl
Reads SGLang's source tree as data (the EntryClass assignments); imports only config classes.
"""

import ast
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
import warnings

warnings.filterwarnings("ignore")
SUFFIXES = re.compile(r"(ForCausalLM|ForConditionalGeneration|Model|NextN|MTP|LMHeadModel|_)+$")


def entry_classes(models_dir):
    """Architecture name -> models file, in file order."""
    out = {}
    for name in sorted(os.listdir(models_dir)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(models_dir, name)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                v = node.value
                elts = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
                for e in elts:
                    if isinstance(e, ast.Name):
                        out.setdefault(e.id, f"models/{name}")
    return out


def transformers_types():
    """Architecture class name -> model_type, from transformers' auto-model name tables."""
    from transformers.models.auto import modeling_auto

    out = {}
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for model_type, classes in table.items():
                for c in classes if isinstance(classes, (list, tuple)) else [classes]:
                    out.setdefault(c, model_type)
    return out


def sglang_config_classes():
    """SGLang's own config classes (srt/configs), by the lower-cased stem of the class name."""
    import sglang.srt.configs as configs
    from transformers import PretrainedConfig

    out = {}
    for info in pkgutil.iter_modules(configs.__path__):
        try:
            module = importlib.import_module(f"sglang.srt.configs.{info.name}")
        except Exception:  # noqa: BLE001 - a config module this host cannot import
            continue
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, PretrainedConfig) and getattr(cls, "model_type", "") and name.endswith("Config"):
                out.setdefault(name[: -len("Config")].lower(), cls)
    return out


def config_of(arch, model_type, own):
    """The config class's defaults with `architectures` set, or (None, why)."""
    from transformers import CONFIG_MAPPING

    cls, source = None, None
    if model_type and model_type in CONFIG_MAPPING:
        cls, source = CONFIG_MAPPING[model_type], "transformers"
    else:
        cls = own.get(SUFFIXES.sub("", arch).lower())
        source = "sglang" if cls else None
    if cls is None:
        return None, None, "no config class with its model_type or name"
    try:
        cfg = cls()
        cfg.architectures = [arch]
        d = cfg.to_dict()
    except Exception as e:  # noqa: BLE001 - reported per architecture
        return None, source, f"{cls.__name__}(): {type(e).__name__}: {e}"
    d["architectures"] = [arch]
    return json.loads(json.dumps(d, default=str)), source, None


def main():
    import sglang

    models_dir = os.path.join(os.path.dirname(sglang.__file__), "srt", "models")
    types = transformers_types()
    own = sglang_config_classes()
    for arch, path in entry_classes(models_dir).items():
        model_type = types.get(arch)
        config, source, why = config_of(arch, model_type, own)
        if config is not None:
            model_type = config.get("model_type", model_type)
        sys.stdout.write(json.dumps({"arch": arch, "file": path, "model_type": model_type, "source": source,
                                     "config": config, "why": why}) + "\n")


if __name__ == "__main__":
    main()
