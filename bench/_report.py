"""Markdown tables and matplotlib plots shared by the core suites (CPU and GPU)."""

from __future__ import annotations

import datetime
import pathlib
import re
import statistics
from collections.abc import Callable, Sequence

OPS = ("lu_factor", "lu_unpack", "lu_solve", "lu_solve_64", "solve")
#: Peers that count for "best peer"; NumPy is a stand-in only where SciPy has no such function.
BEST_OF = ("torch", "jax", "scipy", "numpy")


def _key(r: dict) -> tuple:
    return r["op"], r["dtype"], r["batch"], r["n"]


def best_peer(r: dict) -> tuple[str, float] | None:
    """The fastest peer of a row and lu_core's time over its time."""
    times = [(r[p], p) for p in BEST_OF if r.get(p)]
    if not times:
        return None
    t, p = min(times)
    return p, r["ours"] / t


def summary(runs: Sequence[Sequence[dict]]) -> str:
    """Per run: median and worst ratio against the best peer, and how many cells are at or under 1.0 and 1.2."""
    lines = [
        "| run | cells | median ours/best | worst ours/best (cell) | cells ≤ 1.0 | cells ≤ 1.2 |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for i, rows in enumerate(runs, 1):
        scored = [(bp[1], r) for r in rows if (bp := best_peer(r))]
        if not scored:
            continue
        ratios = [x for x, _ in scored]
        worst, wr = max(scored, key=lambda t: t[0])
        where = f"{worst:.2f}× ({wr['op']} {wr['dtype']} {wr['batch']}×{wr['n']})"
        lines.append(
            f"| {i} | {len(ratios)} | {statistics.median(ratios):.2f}× | {where} | "
            f"{sum(x <= 1.0 for x in ratios)} | {sum(x <= 1.2 for x in ratios)} |"
        )
    return "\n".join(lines)


def best_peer_table(runs: Sequence[Sequence[dict]], peers: Sequence[str]) -> str:
    """One line per cell: lu_core's time (run 1), the best peer and ours/best in every run,
    then run 1's per-peer ratios."""
    later = [{_key(r): r for r in rows} for rows in runs[1:]]
    head = ["op", "dtype", "batch", "n", "lu_core", "spread", "best peer"]
    head += [f"ours/best run {i}" for i in range(1, len(runs) + 1)] + [f"vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * 2 + "---|" + "---:|" * (len(head) - 7)]
    for r in runs[0]:
        bp = best_peer(r)
        cells = [r["op"], r["dtype"], str(r["batch"]), str(r["n"]), _ms(r["ours"]), f"±{r['spread'] * 50:.0f}%"]
        cells.append(bp[0] if bp else "–")
        cells.append(f"**{bp[1]:.2f}×**" if bp else "–")
        for other in later:
            ob = best_peer(other[_key(r)]) if _key(r) in other else None
            cells.append(f"{ob[1]:.2f}× ({ob[0]})" if ob else "–")
        cells += [f"{r['ours'] / r[p]:.2f}×" if r.get(p) else "–" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(rows: Sequence[dict], peers: Sequence[str]) -> str:
    """One line per (op, dtype, batch, n): lu_core's median and spread, then time / peer time."""
    head = ["op", "dtype", "batch", "n", "lu_core", "spread", *[f"vs {p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(head) - 4)]
    for r in rows:
        cells = [r["op"], r["dtype"], str(r["batch"]), str(r["n"]), _ms(r["ours"]), f"±{r['spread'] * 50:.0f}%"]
        cells += [f"{r['ours'] / r[p]:.2f}×" if r.get(p) else "–" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"


def write(report: str, rows: Sequence[dict], peers: Sequence[str], stem: pathlib.Path, title: str) -> pathlib.Path:
    """``<stem>.md`` (the report, then its plots) and the plots beside it."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    pngs = plots(rows, [p for p in peers if any(r.get(p) for r in rows)], stem, title)
    path = stem.with_suffix(".md")
    path.write_text(report + "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n")
    return path


def plots(rows: Sequence[dict], peers: Sequence[str], stem: pathlib.Path, title: str) -> list[pathlib.Path]:
    """``<stem>-time.png`` (time vs n per batch size) and ``<stem>-ratio.png`` (ratio vs peers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in rows})
    dtype = "float64" if "float64" in dtypes else dtypes[0]
    batches = sorted({r["batch"] for r in rows})
    colors = {b: plt.cm.viridis(i / max(1, len(batches) - 1)) for i, b in enumerate(batches)}
    styles = {"lu_core": "-", **{p: s for p, s in zip(peers, ("--", ":", "-.", (0, (1, 4))), strict=False)}}
    paths = []

    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 4), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, op in zip(axes, ops, strict=True):
        for b in batches:
            sel = sorted(
                (r for r in rows if r["op"] == op and r["batch"] == b and r["dtype"] == dtype), key=lambda r: r["n"]
            )
            if not sel:
                continue
            ns = [r["n"] for r in sel]
            ax.plot(
                ns,
                [r["ours"] * 1e3 for r in sel],
                linestyle=styles["lu_core"],
                color=colors[b],
                marker="o",
                label=f"lu_core, batch {b}",
            )
            for p in peers:
                pts = [(r["n"], r[p] * 1e3) for r in sel if r.get(p)]
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        linestyle=styles[p],
                        color=colors[b],
                        alpha=0.7,
                        label=f"{p}, batch {b}",
                    )
        ax.set(xscale="log", yscale="log", xlabel="n", title=op)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time (ms)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7)
    fig.suptitle(f"{title}: time vs n ({dtype}; solid lu_core, dashed/dotted peers)")
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    path = stem.with_name(stem.name + "-time.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, axes = plt.subplots(1, len(peers), figsize=(6 * len(peers), 4), squeeze=False)
    for ax, p in zip(axes[0], peers, strict=True):
        labels, values = [], []
        for r in rows:
            if r["dtype"] == dtype and r.get(p):
                labels.append(f"{r['op']}\n{r['batch']}×{r['n']}")
                values.append(r["ours"] / r[p])
        ax.bar(range(len(values)), values, color=["tab:green" if v <= 1 else "tab:red" for v in values])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set(yscale="log", ylabel=f"lu_core time / {p} time", title=f"vs {p} ({dtype}; below 1: lu_core faster)")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    fig.tight_layout()
    path = stem.with_name(stem.name + "-ratio.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def save_text(
    text: str, out: pathlib.Path | None, name: str, quick: bool, progress: Callable[[str], None]
) -> pathlib.Path | None:
    """Print a plain markdown report and write it as ``<date>-<name>[-quick].md`` in ``out`` (None: print only)."""
    print(text)
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{datetime.date.today().isoformat()}-{name}{'-quick' if quick else ''}.md"
    path.write_text(text)
    progress(f"wrote {path}")
    return path


def device_slug(name: str | None) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``: the GPU model in result file names (``gpu`` when unknown)."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", (name or "").upper())
    return found.group(1).lower() if found else "gpu"
