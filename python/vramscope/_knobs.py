"""Python keyword arguments -> the command line's flags.

The knob names and values are the CLI's (DESIGN.md): `lora_rank=8` is
`--lora-rank 8`, `grad_ckpt="full"` is `--grad-ckpt full`, `sp=True` is `--sp`,
`lora_targets=["q", "v"]` is `--lora-targets q,v`, `from_=["ds.json", "args.json"]`
is `--from ds.json --from args.json`, and `text_encoder=["a", "b"]` is
`--text-encoder a --text-encoder b`. The engine parses the flags
with the CLI's own declarations, so an unknown knob or a bad value raises
ValueError with the CLI's message.
"""

from __future__ import annotations

import os


def flag_name(key: str) -> str:
    """`lora_rank` -> `--lora-rank` (a trailing underscore is dropped: `from_`)."""
    return "--" + key.rstrip("_").replace("_", "-")


def to_flags(knobs: dict) -> list[str]:
    """The flags for `knobs`, in order. True: the bare flag; False or None: left out."""
    flags: list[str] = []
    for key, value in knobs.items():
        flag = flag_name(key)
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, (list, tuple)) and flag in ("--from", "--text-encoder"):
            # --from and --text-encoder are repeatable (one file or model each), not
            # comma lists.
            for v in value:
                flags += [flag, os.fspath(v)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, os.PathLike):
            flags += [flag, os.fspath(value)]
        else:
            flags += [flag, str(value)]
    return flags


def check_keys(knobs: dict, reserved: tuple[str, ...]) -> None:
    """Knobs the API sets itself (json, html, ...) are not taken as keyword arguments."""
    for key in knobs:
        if key in reserved:
            raise ValueError(f"{key}: not a knob of the Python API (see the Report's methods)")
