"""What the API returns: a Report (estimate, simulate, explain) or a Result
(fit, sweep, plan, compare), both over the engine's own JSON.

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
        return f"<vramscope {self.command} result: {', '.join(list(self.data)[:6])}, ...>"


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
        verdict = "fits" if d["fits"] else "does not fit"
        title = _html.escape(f"{d.get('source', '')}: {verdict} on {d['gpu']['name']}")
        assumed = "".join(f"<li>{_html.escape(a['what'])}: {_html.escape(a['assumed'])}</li>"
                          for a in d.get("assumptions", []))
        return (f"<div><b>{title}</b><table>{cells}</table>{self.svg()}"
                f"<details><summary>Assumed</summary><ul>{assumed}</ul></details></div>")

    def __repr__(self) -> str:
        d = self.data
        return (f"<vramscope Report {d.get('source', '')!r} on {d['gpu']['name']}: "
                f"peak allocated {d['peak_allocated_bytes'] / _GIB:.2f} GiB, reserved "
                f"{d['peak_reserved_bytes'] / _GIB:.2f} GiB, device total "
                f"{d['device_total_bytes'] / _GIB:.2f} GiB, {'fits' if d['fits'] else 'does not fit'}>")
