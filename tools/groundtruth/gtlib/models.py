"""Resolves the `model` knob to a Hugging Face config.json dict, without network.

Looked up in order:
  1. a path to a config.json file, or to a directory holding one;
  2. a catalog alias: <dir>/<alias>.json in each models directory
     (data/models/ of the repository, then tools/groundtruth/configs/);
  3. a Hugging Face id matching the `_vramscope.hub_id` of a catalog file.
Catalog files are real config.json contents plus a `_vramscope` key
({alias, hub_id, ...}) that is removed before the dict reaches transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
DEFAULT_MODEL_DIRS = (REPO_ROOT / "data" / "models", HERE.parent / "configs")
MAX_CONFIG_BYTES = 4 << 20


class ModelError(ValueError):
    """The model cannot be found or its config.json is unusable."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str        # the knob as given
    alias: str | None
    hub_id: str | None
    source: str      # path of the file read
    config: dict     # config.json without the _vramscope key


def read_config_file(path):
    """Reads one config.json-like file; returns (config without _vramscope, meta dict)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes, not a config.json")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path}: a config.json must be a JSON object")
    meta = data.get("_vramscope") or {}
    if not isinstance(meta, dict):
        raise ModelError(f"{path}: '_vramscope' must be an object")
    config = {k: v for k, v in data.items() if not k.startswith("_vramscope")}
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise ModelError(f"{path}: no 'model_type' string: not a Hugging Face config.json")
    return config, meta


def resolve_model(name, model_dirs=DEFAULT_MODEL_DIRS):
    """Finds the config for `name` (see module doc). Raises ModelError."""
    candidate = Path(name)
    if candidate.is_file() or candidate.is_dir() or name.endswith(".json"):
        path = candidate / "config.json" if candidate.is_dir() else candidate
        if not path.is_file():
            raise ModelError(f"model '{name}': {path} does not exist")
        config, meta = read_config_file(path)
        return ResolvedModel(name, meta.get("alias"), meta.get("hub_id"), str(path), config)

    safe_alias = name and all(c.isalnum() or c in "-_." for c in name) and not name.startswith(".")
    if safe_alias:
        for directory in model_dirs:
            path = Path(directory) / f"{name}.json"
            if path.is_file():
                config, meta = read_config_file(path)
                return ResolvedModel(name, meta.get("alias", name), meta.get("hub_id"),
                                     str(path), config)
    wanted = name.lower()
    for directory in model_dirs:
        directory = Path(directory)
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            try:
                config, meta = read_config_file(path)
            except ModelError:
                continue
            hub_id = meta.get("hub_id")
            if isinstance(hub_id, str) and hub_id.lower() == wanted:
                return ResolvedModel(name, meta.get("alias", path.stem), hub_id, str(path), config)
    dirs = ", ".join(str(d) for d in model_dirs)
    raise ModelError(
        f"model '{name}': not a config.json path, and no catalog entry of that alias or "
        f"Hugging Face id in {dirs} (the harness never downloads)")


def list_aliases(model_dirs=DEFAULT_MODEL_DIRS):
    """Aliases (file stems) available in the model directories, sorted."""
    names = set()
    for directory in model_dirs:
        directory = Path(directory)
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.json"))
    return sorted(names)
