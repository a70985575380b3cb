"""PNG charts (matplotlib, Agg): small enough to commit (dpi 80)."""

from __future__ import annotations

from pathlib import Path

from .stats import cdf

DPI = 80
COLORS = {"streaming": "tab:blue", "baseline": "tab:red"}
LABELS = {"streaming": "streamvox (streaming)", "baseline": "batch baseline"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path


def conformance_plots(results: dict[str, list[dict]], out_dir: str | Path) -> list[Path]:
    """``results``: server kind ("streaming"/"baseline") -> its list of test dicts."""
    plt = _plt()
    out = Path(out_dir)
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for kind, tests in results.items():
        t = next((t for t in tests if t["name"] == "ttfb_vs_length"), None)
        if t is None:
            continue
        pts = [p for p in t["by_length"] if p["ttfb_ms_p50"] is not None]
        xs = [p["audio_ms"] / 1000 for p in pts]
        ax.plot(xs, [p["ttfb_ms_p50"] for p in pts], "o-", color=COLORS[kind], label=f"{LABELS[kind]} p50")
        ax.plot(xs, [p["ttfb_ms_p95"] for p in pts], "x:", color=COLORS[kind], label=f"{LABELS[kind]} p95")
    ax.set_xlabel("utterance length (s of audio)")
    ax.set_ylabel("TTFB (ms)")
    ax.set_yscale("log")
    _plain_log_axis(ax.yaxis)
    ax.set_title("Time to first audio vs utterance length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "ttfb_vs_length.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    top = 0.0
    for kind, tests in results.items():
        t = next((t for t in tests if t["name"] == "delivery_vs_real_time"), None)
        if t is None or not t["curve_ms"]:
            continue
        xs = [p[0] / 1000 for p in t["curve_ms"]]
        ys = [p[1] / 1000 for p in t["curve_ms"]]
        ax.step(xs, ys, where="post", color=COLORS[kind], label=f"{LABELS[kind]}: audio received")
        ax.plot(
            [xs[0], xs[0] + ys[-1]],
            [0, ys[-1]],
            "--",
            color=COLORS[kind],
            alpha=0.5,
            lw=1,
            label=f"{LABELS[kind]}: playback from first byte",
        )
        top = max(top, xs[0] + ys[-1])
    ax.set_xlim(0, top * 1.02 if top else None)
    ax.set_xlabel("time since the text was sent (s)")
    ax.set_ylabel("audio received (s)")
    ax.set_title("Delivery of a ~5 s utterance")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "delivery.png"))
    return paths


def _plain_log_axis(axis, base: int = 10) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0) if base == 10 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def load_plots(results: dict[str, list[dict]], out_dir: str | Path, ttfb_limit_ms: float = 250.0) -> list[Path]:
    """``results``: server kind -> its list of level dicts."""
    plt = _plt()
    out = Path(out_dir)
    paths = []
    kinds = list(results)
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.4), sharex=True, sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, kind in zip(axes[0], kinds):
        levels = results[kind]
        for i, lv in enumerate(levels):
            if not lv["ttfb_samples_ms"]:
                continue
            xs, ys = cdf(lv["ttfb_samples_ms"])
            ax.step(xs, ys, where="post", color=cmap(i / max(1, len(levels) - 1)), label=f"{lv['streams']} streams")
        ax.axvline(ttfb_limit_ms, color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        _plain_log_axis(ax.xaxis)
        ax.set_xlabel("TTFB (ms)")
        ax.set_title(LABELS[kind], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("fraction of served turns")
    fig.suptitle(f"TTFB CDF per concurrency level (dashed: {ttfb_limit_ms:.0f} ms)", fontsize=10)
    paths.append(_save(fig, out / "ttfb_cdf.png"))

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(11, 3.4))
    for kind in kinds:
        levels = results[kind]
        xs = [lv["streams"] for lv in levels]
        a1.plot(xs, [lv["underrun_ms"] for lv in levels], "o-", color=COLORS[kind], label=LABELS[kind])
        a2.plot(xs, [lv["ttfb_ms_p95"] for lv in levels], "o-", color=COLORS[kind], label=LABELS[kind])
        refused = [100 * lv["refused"] / max(1, lv["refused"] + lv["turns"]) for lv in levels]
        a3.plot(xs, refused, "o-", color=COLORS[kind], label=LABELS[kind])
    for ax, title, ylabel in (
        (a1, "Underruns vs concurrency", "underrun per stream (ms)"),
        (a2, "TTFB p95 vs concurrency", "TTFB p95 (ms)"),
        (a3, "Refused ('overloaded') turns", "% of turn attempts"),
    ):
        ax.set_xscale("log", base=2)
        _plain_log_axis(ax.xaxis, base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    worst = max((lv["underrun_ms"] or 0.0 for levels in results.values() for lv in levels), default=0.0)
    a1.set_ylim(0, max(10.0, worst * 1.15))  # zero underruns should read as a flat line at 0, not noise
    a2.axhline(ttfb_limit_ms, color="grey", ls="--", lw=1)
    a2.set_yscale("log")
    _plain_log_axis(a2.yaxis)
    paths.append(_save(fig, out / "underruns.png"))
    return paths
