"""Grid files: a TOML list of configurations to measure, expanded deterministically.

Format (every key optional except that each configuration needs a model):

    description = "free text"
    [defaults]                  # knobs applied to every block
    steps = 3
    [[sweep]]                   # one block = fixed knobs x cartesian product
    label = "free text"         # recorded with the result, not part of the id
    model = "gpt2"
    batch = 4
    sweep = { seq = [128, 512], attn = ["eager", "sdpa"] }

A block without `sweep` is one configuration. Expansion order is the file's:
blocks in order, and within a block the product in the order the sweep keys
are written, the first key varying slowest. Configurations whose canonical
knobs are equal are kept once (the first). Every problem raises GridError
naming the file, the block and the knob.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import knobs as K

MAX_CONFIGS = 10000
_TOP_KEYS = {"description", "defaults", "sweep"}
_BLOCK_EXTRA_KEYS = {"label", "sweep"}


class GridError(ValueError):
    """A grid file cannot be read or describes an invalid configuration."""


@dataclass(frozen=True)
class Config:
    """One expanded configuration: canonical knobs, their id and name."""
    id: str
    name: str
    knobs: dict
    label: str | None
    block: int  # 1-based index of the [[sweep]] block it came from


def load_grid(path):
    """Reads and expands a grid file. Returns a list of Config."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"{path}: cannot read grid file: {e}") from e
    return parse_grid(text, str(path))


def parse_grid(text, source="<grid>"):
    """Parses grid TOML text; `source` names it in error messages."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{source}: not valid TOML: {e}") from e
    return expand_grid(doc, source)


def expand_grid(doc, source="<grid>"):
    """Expands a parsed grid document (a dict as tomllib returns it)."""
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise GridError(
            f"{source}: unknown top-level key(s) {unknown} "
            "(expected: description, [defaults], [[sweep]])")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise GridError(f"{source}: [defaults] must be a table")
    _check_scalars(defaults, f"{source}: [defaults]")
    blocks = doc.get("sweep", [])
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise GridError(f"{source}: 'sweep' must be an array of tables ([[sweep]])")
    if not blocks:
        raise GridError(f"{source}: no [[sweep]] block: the grid has no configuration")

    configs, seen = [], set()
    for index, block in enumerate(blocks, start=1):
        where = f"{source}: [[sweep]] #{index}"
        for raw in _expand_block(block, defaults, where):
            try:
                canonical = K.normalize_knobs(raw)
            except K.KnobError as e:
                raise GridError(f"{where}: {e}") from e
            cid = K.config_id(canonical)
            if cid in seen:
                continue
            seen.add(cid)
            configs.append(Config(cid, K.config_name(canonical), canonical,
                                  block.get("label"), index))
    return configs


def _expand_block(block, defaults, where):
    label = block.get("label")
    if label is not None and not isinstance(label, str):
        raise GridError(f"{where}: 'label' must be a string")
    fixed = {k: v for k, v in block.items() if k not in _BLOCK_EXTRA_KEYS}
    _check_scalars(fixed, where)
    sweep = block.get("sweep", {})
    if not isinstance(sweep, dict):
        raise GridError(f"{where}: 'sweep' must be a table of lists, e.g. sweep = {{seq = [128, 512]}}")
    _check_knob_names(sweep, where + " sweep")
    axes = []
    for name, values in sweep.items():
        if not isinstance(values, list):
            raise GridError(f"{where}: sweep.{name} must be a list of values, got {values!r}")
        if not values:
            raise GridError(f"{where}: sweep.{name} is an empty list")
        if name in fixed:
            raise GridError(f"{where}: '{name}' is both a fixed knob and swept")
        axes.append((name, values))
    count = 1
    for _, values in axes:
        count *= len(values)
        if count > MAX_CONFIGS:
            raise GridError(f"{where}: the sweep expands to more than {MAX_CONFIGS} configurations")
    base = dict(defaults)
    base.update(fixed)
    names = [name for name, _ in axes]
    for combo in itertools.product(*(values for _, values in axes)):
        raw = dict(base)
        raw.update(zip(names, combo))
        yield raw


def _check_knob_names(table, where):
    unknown = sorted(set(table) - set(K.KNOB_ORDER))
    if unknown:
        raise GridError(f"{where}: unknown knob(s) {unknown} (known: {', '.join(K.KNOB_ORDER)})")


def _check_scalars(table, where):
    """Lists are only allowed in sweep tables (lora_targets may be a list of names)."""
    _check_knob_names(table, where)
    for name, value in table.items():
        if isinstance(value, dict):
            raise GridError(f"{where}: knob '{name}' must be a single value, got a table")
        if isinstance(value, list) and name != "lora_targets":
            raise GridError(
                f"{where}: knob '{name}' is a list; put lists in the block's sweep table, "
                f"e.g. sweep = {{{name} = {value!r}}}")


def select(configs, patterns):
    """Configs whose id or name matches any glob in `patterns` (implicit * at both ends)."""
    if not patterns:
        return list(configs)
    from fnmatch import fnmatchcase
    globs = [p if any(c in p for c in "*?[") else f"*{p}*" for p in patterns]
    globs = [g if g.startswith("*") else "*" + g for g in globs]
    globs = [g if g.endswith("*") else g + "*" for g in globs]
    return [c for c in configs
            if any(fnmatchcase(c.id, g) or fnmatchcase(c.name, g) for g in globs)]
