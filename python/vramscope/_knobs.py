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

import numbers
import os


def check_text(text, what: str) -> None:
    """A flag value or path must not hold a NUL byte: C++ would read the text
    only up to it (a path "a.json\0b" would open a.json)."""
    if isinstance(text, bytes) and b"\0" in text or isinstance(text, str) and "\0" in text:
        raise ValueError(f"{what}: {text[:80]!r} contains a NUL byte")


def flag_name(key: str) -> str:
    """`lora_rank` -> `--lora-rank` (a trailing underscore is dropped: `from_`)."""
    return "--" + key.rstrip("_").replace("_", "-")


def to_flags(knobs: dict) -> list[str]:
    """The flags for `knobs`, in order. True: the bare flag; False or None: left out.
    Values are str, numbers, paths (os.PathLike) or lists of them: anything else is a
    TypeError here rather than whatever its str() makes of it."""
    flags: list[str] = []
    for key, value in knobs.items():
        check_text(key, "keyword")
        flag = flag_name(key)
        start = len(flags)
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, (list, tuple)) and flag in ("--from", "--text-encoder"):
            # --from and --text-encoder are repeatable (one file or model each), not
            # comma lists.
            for v in value:
                flags += [flag, path_arg(v, key)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, ",".join(_text(v, key) for v in value)]
        elif isinstance(value, os.PathLike):
            flags += [flag, path_arg(value, key)]
        else:
            flags += [flag, _text(value, key)]
        for text in flags[start:]:
            check_text(text, key)
    return flags


def _text(value, key: str) -> str:
    """A knob's value as the command line's text: a str or a number."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Number)):
        raise TypeError(f"{key}: expected a str or a number, got {type(value).__name__}")
    return str(value)


def path_arg(value, key: str) -> str:
    """A path argument as text: str or os.PathLike of str (bytes paths: TypeError)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{key}: expected a path (str or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{key}: expected a str path, got {type(path).__name__}")
    check_text(path, key)
    return path


def check_keys(knobs: dict, reserved: tuple[str, ...]) -> None:
    """Knobs the API sets itself (json, html, ...) are not taken as keyword arguments."""
    for key in knobs:
        if key in reserved:
            raise ValueError(f"{key}: not a knob of the Python API (see the Report's methods)")
