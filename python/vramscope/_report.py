"""What the API returns: a Report (estimate, simulate, explain), a FitResult (fit) or a
Result (sweep, plan, compare), all over the engine's own JSON.

`Report` has the keys of `vramscope estimate --json` (docs/json-schema.md) as
attributes (`report.peak_allocated_bytes`, `report.fits`, `report.gpu`, ...),
plus the timeline as arrays, the live-at-peak table and the renderings the CLI
has (text, HTML page, SVG chart, CSV).
"""

from __future__ import annotations

import html as _html
import json
import os
from typing import Any

_GIB = float(1 << 30)
_REPR_VALUES = 6  # scalar values a Result's repr shows


class Result:
    """A command's result: `data` is the dict of its `--json` output; its keys are attributes."""

    def __init__(self, value, command: str):
        self._value = value
        self.command = command
        self.data: dict = json.loads(value.json)

    def __getattr__(self, key: str) -> Any:
        data = self.__dict__.get("data")
        if data is not None and key in data:
            return data[key]
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.data))

    def to_dict(self) -> dict:
        return self.data

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 2) -> str:
        """The JSON text (what `vramscope <command> --json` prints); also written to `path`."""
        text = self._value.json if indent == 2 else json.dumps(self.data, indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def text(self) -> str:
        """What the command prints without --json."""
        return self._value.text() or ""

    def __str__(self) -> str:
        return self.text()

    def to_html(self, path: str | os.PathLike) -> str:
        """Writes the command's self-contained HTML page (what --html writes); returns the path."""
        page = self._value.html()
        if page is None:
            raise ValueError(f"{self.command} has no HTML page")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        return os.fspath(path)

    def __repr__(self) -> str:
        """The command, its source and its answer in values (bytes in GiB)."""
        summary = _SUMMARIES.get(self.command, _scalars)(self.data)
        source = self.data.get("source", self.data.get("snapshot", ""))
        return f"<vramscope {self.command} {source!r}: {summary}>"


def _gib(value) -> str:
    return f"{value / _GIB:.2f} GiB" if isinstance(value, (int, float)) else "?"


def _scalars(d: dict) -> str:
    """The first scalar values: what a result without a summary of its own shows."""
    shown = [f"{k}={_gib(v) if k.endswith('_bytes') else repr(v)}" for k, v in d.items()
             if k not in ("command", "source") and isinstance(v, (bool, int, float, str))]
    return ", ".join(shown[:_REPR_VALUES]) + (", ..." if len(shown) > _REPR_VALUES else "")


def _sweep(d: dict) -> str:
    """"seq=512 3.10 GiB, seq=1024 4.20 GiB (3 points, 2 fit on h100-80g)": what each point
    needs on the device."""
    names = d.get("variables") or []
    points = d.get("points") or []
    shown = []
    for p in points[:4]:
        where = " ".join(f"{n}={p.get(n)}" for n in names)
        shown.append(f"{where} {_gib(p.get('needed_bytes', p.get('device_total_bytes')))}")
    fits = sum(bool(p.get("fits")) for p in points)
    return (", ".join(shown) + (", ..." if len(points) > 4 else "") +
            f" ({len(points)} points, {fits} fit on {d.get('gpu', {}).get('name', '')})")


def _plan(d: dict) -> str:
    strategies = d.get("strategies") or []
    fitting = [s for s in strategies if s.get("fits")]
    if not fitting:
        return f"none of {len(strategies)} strategies listed fits"
    best = fitting[0]
    return (f"best {best.get('label', '')!r}: {best.get('tokens_per_second', 0):.0f} tokens/s, "
            f"device total {_gib(best.get('device_total_bytes'))} "
            f"({len(fitting)} of {len(strategies)} listed fit)")


def _compare(d: dict) -> str:
    shown = []
    for key, label in (("peak_allocated_bytes", "peak allocated"),
                       ("peak_reserved_bytes", "peak reserved")):
        row = (d.get("totals") or {}).get(key) or {}
        measured, predicted = row.get("measured_bytes"), row.get("predicted_bytes")
        if measured and predicted is not None:
            shown.append(f"{label} measured {_gib(measured)}, predicted {_gib(predicted)} "
                         f"({(predicted - measured) / measured * 100:+.1f}%)")
    return f"{'; '.join(shown)} (model {d.get('model', '')})"


_SUMMARIES = {"sweep": _sweep, "plan": _plan, "compare": _compare}


class FitResult(Result):
    """fit's result: the answers as attributes, None where there is none (nothing fits, no
    GPU count searched); `data` is the engine's JSON as `vramscope fit --json` prints it."""

    def _answer(self, key: str, search: str):
        part = self.data.get(search)
        if not isinstance(part, dict) or not part.get("fits"):
            return None
        return self.data.get(key)

    @property
    def max_batch(self) -> int | None:
        """The largest micro-batch that fits at the setup's sequence; None when none does."""
        return self._answer("max_batch", "batch")

    @property
    def max_seq(self) -> int | None:
        """The longest sequence that fits at the setup's batch; None when none does."""
        return self._answer("max_seq", "seq")

    @property
    def max_image_size(self) -> int | None:
        """A diffusion model's largest image side that fits; None when none does."""
        return self._answer("max_image_size", "image_size")

    @property
    def suggestion(self) -> dict | None:
        """When no micro-batch fits: the one-knob change under which one does ({"flags":
        "--grad-ckpt full", "why": ..., "max_batch": 2, "needed_bytes": ...}); else None."""
        return self.data.get("suggestion")

    @property
    def min_gpus(self) -> int | None:
        """The fewest GPUs that fit (max_gpus=...); None when not searched or none fit."""
        return self.data.get("min_gpus") or None

    def __repr__(self) -> str:
        second = "max_image_size" if "max_image_size" in self.data else "max_seq"
        gpus = f", min_gpus={self.min_gpus}" if "min_gpus" in self.data else ""
        return (f"<vramscope fit {self.data.get('source', '')!r} on "
                f"{self.data.get('gpu', {}).get('name', '')}: max_batch={self.max_batch}, "
                f"{second}={getattr(self, second)}{gpus}>")


class Report(Result):
    """The report of estimate, simulate and explain."""

    @property
    def breakdown(self) -> dict:
        """Bytes per category alive at the peak (`breakdown_at_peak`)."""
        return self.data["breakdown_at_peak"]

    @property
    def live_at_peak(self) -> list[dict]:
        """The largest allocations alive at the peak, largest first (`top_allocations`)."""
        return self.data.get("top_allocations", [])

    @property
    def timeline(self) -> dict:
        """The worst rank class's timeline as columns (numpy arrays when numpy is installed):
        event_index, step, phase, allocated_bytes, reserved_bytes and one column of allocated
        bytes per category."""
        columns = self._value.timeline() or {}
        try:
            import numpy as np
        except ImportError:
            return columns
        return {k: np.asarray(v) for k, v in columns.items()}

    def timeline_frame(self):
        """The timeline as a pandas DataFrame (pandas must be installed)."""
        import pandas as pd
        return pd.DataFrame(self._value.timeline() or {})

    def svg(self) -> str:
        """The timeline chart (what --svg writes)."""
        return self._value.svg() or ""

    def to_svg(self, path: str | os.PathLike) -> str:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.svg())
        return os.fspath(path)

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        """The timeline as CSV (what --csv writes); also written to `path`."""
        text = self._value.csv() or ""
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def plot(self, ax=None):
        """Allocated and reserved bytes (GiB) over the events, with matplotlib; returns the axes."""
        import matplotlib.pyplot as plt
        t = self._value.timeline() or {}
        ax = ax or plt.subplots(figsize=(8, 3))[1]
        x = t.get("event_index", [])
        ax.plot(x, [b / _GIB for b in t.get("reserved_bytes", [])], label="reserved")
        ax.plot(x, [b / _GIB for b in t.get("allocated_bytes", [])], label="allocated")
        ax.axhline(self.data["gpu"]["usable_bytes"] / _GIB, color="grey", ls="--", label="usable")
        ax.set_xlabel("event")
        ax.set_ylabel("GiB")
        ax.set_title(f"{self.data.get('source', '')} on {self.data['gpu']['name']}")
        ax.legend()
        ax.figure.tight_layout()
        return ax

    def _repr_html_(self) -> str:
        d = self.data
        rows = [("peak allocated", d["peak_allocated_bytes"]),
                ("peak reserved", d["peak_reserved_bytes"]),
                ("device total", d["device_total_bytes"])]
        rows += [(k, v) for k, v in self.breakdown.items() if v]
        cells = "".join(f"<tr><td>{_html.escape(k)}</td><td style='text-align:right'>"
                        f"{v / _GIB:.2f} GiB</td></tr>" for k, v in rows)
        title = _html.escape(f"{d.get('source', '')}: {_verdict(d)}")
        assumed = "".join(f"<li>{_html.escape(a['what'])}: {_html.escape(a['assumed'])}</li>"
                          for a in d.get("assumptions", []))
        return (f"<div><b>{title}</b><table>{cells}</table>{self.svg()}"
                f"<details><summary>Assumed</summary><ul>{assumed}</ul></details></div>")

    def __repr__(self) -> str:
        d = self.data
        return (f"<vramscope Report {d.get('source', '')!r}: "
                f"peak allocated {d['peak_allocated_bytes'] / _GIB:.2f} GiB, reserved "
                f"{d['peak_reserved_bytes'] / _GIB:.2f} GiB, device total "
                f"{d['device_total_bytes'] / _GIB:.2f} GiB, {_verdict(d)}>")


def _verdict(d: dict) -> str:
    """"fits on h100-80g", "does not fit on ...", or no verdict (`fits` null: a measured
    snapshot whose GPU is not known)."""
    if d.get("fits") is None:
        return "no fit verdict (the GPU is not known)"
    return f"{'fits' if d['fits'] else 'does not fit'} on {d['gpu']['name']}"
