"""One self-contained HTML page: sections, notes, tables (also written as CSV) and matplotlib
figures (also written as PNG, embedded in the page as base64). No script, no external URL: the
page opens from a file, a mail attachment or an archive years later."""

from __future__ import annotations

import base64
import html
import math
import numbers
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

__all__ = ["Page", "cell", "plt"]

plt.rcParams.update(
    {
        "figure.dpi": 100,
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.labelsize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "legend.fontsize": 9,
        "savefig.bbox": "tight",
    }
)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto;
       max-width: 90em; padding: 0 1em; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { border-bottom: 2px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.92em; }
.tbl { overflow-x: auto; margin: 0.6em 0 1em; }
.tbl table { margin: 0.2em 0 0; }
.cap { font-weight: 600; margin: 0.2em 0; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; vertical-align: top; }
th { background: #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td:first-child { white-space: nowrap; }
tr.flag td { background: #fde2e1; }
tr.bad td { background: #fff3cd; }
.note, .warn { padding: 0.4em 0.8em; margin: 0.6em 0; }
.note { background: #fff8e1; border-left: 4px solid #f0ad4e; }
.warn { background: #fde2e1; border-left: 4px solid #d9534f; }
.muted { color: #666; font-size: 0.9em; }
figure { margin: 1em 0 1.5em; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.92em; color: #333; margin-top: 0.3em; }
nav ul { columns: 2; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
a.file { font-size: 0.85em; }
"""


def cell(value: Any, digits: int = 1) -> str:
    """A table cell's text: numbers rounded, missing values as an en dash."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.{digits}f}"
    return str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


class Page:
    """Collects the report's parts in order; ``write`` renders index.html into ``out_dir``,
    where tables and figures have been written as CSV and PNG as they were added."""

    def __init__(self, title: str, out_dir: Path) -> None:
        self.title = title
        self.out_dir = out_dir
        self.parts: list[str] = []
        self.toc: list[tuple[str, str]] = []
        self.files: list[str] = []
        out_dir.mkdir(parents=True, exist_ok=True)

    def section(self, title: str) -> None:
        anchor = _slug(title)
        while any(a == anchor for a, _ in self.toc):
            anchor += "-x"
        self.toc.append((anchor, title))
        self.parts.append(f'<h2 id="{anchor}">{html.escape(title)}</h2>')

    def heading(self, title: str) -> None:
        self.parts.append(f"<h3>{html.escape(title)}</h3>")

    def text(self, text: str, cls: str | None = None) -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{attr}>{html.escape(text)}</p>")

    def note(self, text: str) -> None:
        """Something the reader must know to read the numbers right (missing data, ...)."""
        self.parts.append(f'<div class="note">{html.escape(text)}</div>')

    def warn(self, text: str) -> None:
        self.parts.append(f'<div class="warn">{html.escape(text)}</div>')

    def items(self, lines: list[str]) -> None:
        lis = "".join(f"<li>{html.escape(x)}</li>" for x in lines)
        self.parts.append(f"<ul>{lis}</ul>")

    def details(self, summary: str, body: str) -> None:
        """A folded block of preformatted text (e.g. the experiment file)."""
        self.parts.append(
            f"<details><summary>{html.escape(summary)}</summary>"
            f"<pre>{html.escape(body)}</pre></details>"
        )

    def table(
        self,
        frame: pd.DataFrame,
        caption: str,
        csv: str | None = None,
        digits: Mapping[str, int] | None = None,
        row_class: Callable[[pd.Series], str | None] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``frame`` as an HTML table (its index, if named, as leading columns) and, with
        ``csv``, as that CSV file beside the page with every digit and the column names as
        they are (``labels`` renames columns in the page only)."""
        flat = frame.reset_index() if any(n is not None for n in frame.index.names) else frame
        if csv:
            flat.to_csv(self.out_dir / csv, index=False)
            self.files.append(csv)
        digits = digits or {}
        labels = labels or {}
        head = "".join(f"<th>{html.escape(labels.get(str(c), str(c)))}</th>" for c in flat.columns)
        body = []
        for _, row in flat.iterrows():
            cls = row_class(row) if row_class else None
            tds = []
            for c in flat.columns:
                v = row[c]
                num = isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_)
                td = '<td class="num">' if num else "<td>"
                tds.append(f"{td}{html.escape(cell(v, digits.get(str(c), 1)))}</td>")
            body.append(f"<tr{f' class={cls!r}' if cls else ''}>{''.join(tds)}</tr>")
        link = f' <a class="file" href="{html.escape(csv)}">{html.escape(csv)}</a>' if csv else ""
        self.parts.append(
            f'<div class="tbl"><p class="cap">{html.escape(caption)}{link}</p>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )

    def figure(self, fig: Any, name: str, caption: str) -> None:
        """A matplotlib figure: written as ``name`` (PNG) and embedded in the page."""
        path = self.out_dir / name
        fig.savefig(path, format="png", dpi=110)
        plt.close(fig)
        self.files.append(name)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.parts.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)} "
            f'<a class="file" href="{html.escape(name)}">{html.escape(name)}</a>'
            "</figcaption></figure>"
        )

    def write(self, subtitle: str = "") -> Path:
        toc = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in self.toc)
        doc = (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(self.title)}</h1>"
            f'<p class="muted">{html.escape(subtitle)}</p>'
            f"<nav><ul>{toc}</ul></nav>" + "\n".join(self.parts) + "</body></html>\n"
        )
        out = self.out_dir / "index.html"
        out.write_text(doc, encoding="utf-8")
        return out
