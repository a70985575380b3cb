"""What people read: rich tables for the terminal, and the JSON document (stable field names)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .stats import ratio

# (test name, title) and its figures: (label, key, unit). "x" is a plain ratio.
Row = tuple[str, str | tuple[str, ...], str]
CONFORMANCE_ROWS: dict[str, tuple[str, list[Row]]] = {
    "ttfb_vs_length": (
        "1. TTFB vs utterance length",
        [
            ("TTFB p50, ~1 s text", "ttfb_ms_p50_1s", "ms"),
            ("TTFB p95, ~1 s text", "ttfb_ms_p95_1s", "ms"),
            ("TTFB p50, ~5 s text", "ttfb_ms_p50_5s", "ms"),
            ("TTFB p95, ~5 s text", "ttfb_ms_p95_5s", "ms"),
            ("TTFB ratio ~5 s / ~1 s (medians)", "ttfb_ratio_5s_1s", "x"),
            ("open -> started p50", "open_ms_p50", "ms"),
            ("audio of the ~1 s / ~5 s text", ("audio_ms_1s", "audio_ms_5s"), "ms"),
            ("requests refused 'overloaded' (retried)", "refused", ""),
        ],
    ),
    "delivery_vs_real_time": (
        "2. Time to last byte vs TTFB (~5 s text)",
        [
            ("TTFB p50", "ttfb_ms_p50", "ms"),
            ("time to last byte p50", "ttlb_ms_p50", "ms"),
            ("audio duration", "audio_ms", "ms"),
            ("delivery spread / audio duration", "spread_ratio_p50", "x"),
            ("max audio ahead of playback p50", "max_lead_ms_p50", "ms"),
            ("player underruns (all runs)", "underruns", ""),
        ],
    ),
    "mid_stream_cancel": (
        "3. Mid-stream cancel (1 s after first audio)",
        [
            ("cancel -> ack p50", "cancel_ack_ms_p50", "ms"),
            ("cancel -> ack p95", "cancel_ack_ms_p95", "ms"),
            ("audio received after the cancel p50", "audio_after_cancel_ms_p50", "ms"),
            ("frames after the ack (must be 0)", "frames_after_ack", ""),
            ("unplayed audio held by the client at cancel p50", "unplayed_at_cancel_ms_p50", "ms"),
            ("utterance already complete at cancel (runs)", "finished_before_cancel", ""),
            ("requests refused 'overloaded' (retried)", "refused", ""),
        ],
    ),
    "input_update": (
        "4. Mid-stream input update (two pieces 200 ms apart)",
        [
            ("audio, whole text at once", "audio_ms_whole", "ms"),
            ("audio, two pieces p50", "audio_ms_split_p50", "ms"),
            ("duration ratio pieces / whole", "duration_ratio", "x"),
            ("TTFB p50 (from the first piece)", "ttfb_ms_p50", "ms"),
            ("second piece's key words heard (Whisper)", "second_piece_words_found", "x"),
            ("requests refused 'overloaded' (retried)", "refused", ""),
        ],
    ),
    "connection_persistence": (
        "5. Connection persistence",
        [
            ("TTFB p50, first request on a connection", "ttfb_ms_p50_first", "ms"),
            ("TTFB p50, right after a cancel (same connection)", "ttfb_ms_p50_after_cancel", "ms"),
            ("TTFB p50, fresh connection (from text)", "ttfb_ms_p50_fresh", "ms"),
            ("TTFB p50, fresh connection incl. connect", "ttfb_ms_p50_fresh_incl_connect", "ms"),
            ("connect + ready p50", "connect_ms_p50", "ms"),
            (
                "refused 'overloaded': first / after cancel / fresh",
                ("refused_first", "refused_after_cancel", "refused_fresh"),
                "",
            ),
        ],
    ),
}

# Figures compared across servers at the top of the JSON (baseline / streaming).
HEADLINE = {
    "ttfb_vs_length": ("ttfb_ms_p50_1s", "ttfb_ms_p50_5s", "ttfb_ratio_5s_1s"),
    "delivery_vs_real_time": ("ttlb_ms_p50", "max_lead_ms_p50"),
    "mid_stream_cancel": ("cancel_ack_ms_p50", "cancel_ack_ms_p95", "unplayed_at_cancel_ms_p50"),
    "connection_persistence": ("ttfb_ms_p50_after_cancel", "ttfb_ms_p50_fresh_incl_connect"),
}


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value}"
    if unit == "ms":
        return f"{value:,.0f} ms" if abs(value) >= 100 else f"{value:.1f} ms"
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:g}"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def _verdict(test: dict | None) -> str:
    if test is None:
        return ""
    return "[green]PASS[/]" if test["passed"] else "[red]FAIL[/]"


def conformance_table(tests: list[dict], baseline: list[dict] | None) -> Table:
    table = Table(title="streamvox bench conformance", title_justify="left", show_lines=False)
    table.add_column("figure")
    table.add_column("streamvox", justify="right")
    if baseline is not None:
        table.add_column("batch baseline", justify="right")
        table.add_column("baseline / streamvox", justify="right")
    by_name = {t["name"]: t for t in tests}
    base = {t["name"]: t for t in baseline or []}
    for name, (title, rows) in CONFORMANCE_ROWS.items():
        test = by_name.get(name)
        if test is None:
            continue
        b = base.get(name)
        head = [f"[bold]{title}[/]", _verdict(test)]
        if baseline is not None:
            head += [_verdict(b), ""]
        table.add_row(*head, end_section=False)
        for label, key, unit in rows:
            if isinstance(key, tuple):
                vals = [" / ".join(fmt(t.get(k), unit) for k in key) if t else "-" for t in (test, b)]
                cells = [f"  {label}", vals[0]]
                if baseline is not None:
                    cells += [vals[1], ""]
            else:
                if key not in test:
                    continue
                cells = [f"  {label}", fmt(test.get(key), unit)]
                if baseline is not None:
                    bv = b.get(key) if b else None
                    r = ratio(bv, test.get(key)) if unit in ("ms", "x") else None
                    cells += [fmt(bv, unit), fmt_ratio(r)]
            table.add_row(*cells)
        table.add_row(*([""] * (4 if baseline is not None else 2)), end_section=True)
    return table


def criteria(tests: list[dict]) -> str:
    """The pass rule of each test, for printing under the table."""
    lines = ["[dim]pass rules:"]
    for t in tests:
        title = CONFORMANCE_ROWS.get(t["name"], (t["name"], []))[0]
        lines.append(f"  {title.split(' ', 1)[0]} {t['criterion']}")
    return "\n".join(lines) + "[/]"


def load_table(title: str, levels: list[dict], max_healthy: int) -> Table:
    table = Table(title=f"{title} - max healthy streams: {max_healthy}", title_justify="left")
    for col in (
        "streams",
        "turns",
        "refused",
        "TTFB p50",
        "TTFB p95",
        "TTFB p99",
        "gap p95",
        "underruns/stream",
        "underrun/stream",
        "RTF (audio/wall)",
        "server CPU",
        "healthy",
    ):
        table.add_column(col, justify="right")
    for lv in levels:
        table.add_row(
            str(lv["streams"]),
            str(lv["turns"]),
            str(lv["refused"])
            + (f" (+{lv['errors'] + lv['timeouts']} failed)" if lv["errors"] + lv["timeouts"] else ""),
            fmt(lv["ttfb_ms_p50"], "ms"),
            fmt(lv["ttfb_ms_p95"], "ms"),
            fmt(lv["ttfb_ms_p99"], "ms"),
            fmt(lv["gap_ms_p95"], "ms"),
            f"{lv['underruns']:.2f}",
            fmt(lv["underrun_ms"], "ms"),
            f"{lv['rtf']:.2f}" if lv["rtf"] is not None else "-",
            f"{lv['cpu_pct']:.0f} %" if lv["cpu_pct"] is not None else "-",
            "[green]yes[/]" if lv["healthy"] else "[red]no[/]",
        )
    return table


def level_line(lv: dict) -> str:
    """One load level in a line, printed as it finishes (a sweep's progress, a log's record)."""
    return (
        f"{lv['streams']:>3} streams: TTFB p95 {fmt(lv['ttfb_ms_p95'], 'ms')}, "
        f"underruns/stream {lv['underruns']:.2f}, refused {lv['refused']}, "
        f"server CPU {fmt(lv['cpu_pct'])} %, {'healthy' if lv['healthy'] else 'not healthy'}"
    )


def _refused(lv: dict) -> str:
    failed = lv["errors"] + lv["timeouts"]
    return str(lv["refused"]) + (f" (+{failed} failed)" if failed else "")


def load_comparison(levels: list[dict], baseline: list[dict]) -> Table:
    table = Table(title="load: batch baseline / streamvox", title_justify="left")
    for col in ("streams", "TTFB p50", "TTFB p95", "underrun ms/stream", "server CPU"):
        table.add_column(col, justify="right")
    base = {lv["streams"]: lv for lv in baseline}
    for lv in levels:
        b = base.get(lv["streams"])
        if b is None:
            continue
        table.add_row(
            str(lv["streams"]),
            fmt_ratio(ratio(b["ttfb_ms_p50"], lv["ttfb_ms_p50"])),
            fmt_ratio(ratio(b["ttfb_ms_p95"], lv["ttfb_ms_p95"])),
            f"{fmt(b['underrun_ms'], 'ms')} vs {fmt(lv['underrun_ms'], 'ms')}",
            f"{fmt(b['cpu_pct'])} % vs {fmt(lv['cpu_pct'])} %",
        )
    return table


def headline_ratios(tests: list[dict], baseline: list[dict]) -> dict[str, float | None]:
    """``baseline / streaming`` for the figures people quote."""
    s = {t["name"]: t for t in tests}
    b = {t["name"]: t for t in baseline}
    out: dict[str, float | None] = {}
    for name, keys in HEADLINE.items():
        if name in s and name in b:
            for key in keys:
                r = ratio(b[name].get(key), s[name].get(key))
                out[key] = None if r is None else round(r, 2)
    return out


def document(kind: str, *, machine: dict, options: dict, server: dict, body: dict, baseline: dict | None) -> dict:
    """The JSON document: the server under test's results at the top level, the baseline beside."""
    return {
        "bench": kind,
        "schema": 1,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "options": options,
        "server": server,
        **body,
        "baseline": baseline,
    }


def write_json(path: str | Path, doc: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = 140  # a log file or a pipe: do not squeeze the tables into 80 columns
    return c


# ---------------------------------------------------------------- markdown (docs/BENCHMARKS.md)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _pf(test: dict | None) -> str:
    return "" if test is None else ("**pass**" if test["passed"] else "**FAIL**")


def markdown_conformance(doc: dict) -> str:
    tests = {t["name"]: t for t in doc["tests"]}
    base = {t["name"]: t for t in (doc.get("baseline") or {}).get("tests", [])}
    header = ["figure", "streamvox", "batch baseline", "baseline / streamvox"]
    rows: list[list[str]] = []
    for name, (title, figs) in CONFORMANCE_ROWS.items():
        t, b = tests.get(name), base.get(name)
        if t is None:
            continue
        rows.append([f"**{title}**", _pf(t), _pf(b), ""])
        for label, key, unit in figs:
            if isinstance(key, tuple):
                rows.append([label, *(" / ".join(fmt(x.get(k), unit) for k in key) if x else "-" for x in (t, b)), ""])
            elif key in t:
                bv = b.get(key) if b else None
                r = ratio(bv, t.get(key)) if unit in ("ms", "x") else None
                rows.append([label, fmt(t.get(key), unit), fmt(bv, unit), fmt_ratio(r)])
    return _md_table(header, rows)


def _opt(level: dict, key: str, spec: str) -> str:
    """A figure older JSON files do not have, or a server does not report: '-'."""
    value = level.get(key)
    return "-" if value is None else spec.format(value)


def markdown_load(doc: dict) -> str:
    header = ["server", "streams", "turns", "refused", "TTFB p50", "TTFB p95", "TTFB p99", "gap p95",
              "underruns / stream", "underrun ms / stream", "RTF", "server CPU", "CPU s / audio s", "/readyz capacity",
              "healthy"]  # fmt: skip
    rows = []
    for label, part in (("streamvox", doc), ("baseline", doc.get("baseline"))):
        for lv in (part or {}).get("levels", []):
            rows.append(
                [label, str(lv["streams"]), str(lv["turns"]), _refused(lv), fmt(lv["ttfb_ms_p50"], "ms"),
                 fmt(lv["ttfb_ms_p95"], "ms"), fmt(lv["ttfb_ms_p99"], "ms"), fmt(lv["gap_ms_p95"], "ms"),
                 f"{lv['underruns']:.2f}", fmt(lv["underrun_ms"], "ms"), fmt(lv["rtf"], "x"),
                 "-" if lv["cpu_pct"] is None else f"{lv['cpu_pct']:.0f} %", _opt(lv, "cpu_s_per_audio_s", "{:.3f}"),
                 _opt(lv, "capacity_streams", "{:.0f}"), "yes" if lv["healthy"] else "no"]
            )  # fmt: skip
    out = _md_table(header, rows)
    out += f"\n\n`max_healthy_streams`: streamvox **{doc['max_healthy_streams']}**"
    if doc.get("baseline"):
        out += f", batch baseline **{doc['baseline']['max_healthy_streams']}**"
    return out


MARKDOWN_KINDS = ("load", "conformance")


def markdown(doc: dict) -> str:
    """The tables of a ``bench load`` or ``bench conformance`` JSON; ``ValueError`` (with what the
    file is instead) for any other document."""
    kind = doc.get("bench") if isinstance(doc, dict) else None
    needed = "max_healthy_streams" if kind == "load" else "tests"
    if kind not in MARKDOWN_KINDS or needed not in doc:
        what = f"a {kind!r} document" if kind else 'no bench document (no "bench" field)'
        raise ValueError(
            f"this is {what}; markdown renders the JSON of `streamvox bench load` or `bench conformance`"
            + (f" (missing {needed!r})" if kind in MARKDOWN_KINDS else "")
        )
    m = doc.get("machine", {})
    head = (
        f"_{doc.get('bench')} run of {doc.get('date')}: {m.get('cores')} cores ({m.get('cpu_model')}), "
        f"load average {m.get('load_avg_1m_at_start')} at start, {m.get('load_avg_1m_at_end')} at the end._\n\n"
    )
    return head + (markdown_conformance(doc) if doc.get("bench") == "conformance" else markdown_load(doc))
