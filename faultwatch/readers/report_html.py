"""`faultwatch report JOB --html FILE`: one self-contained page (inline CSS and SVG, no script,
no font or image from anywhere: a Content-Security-Policy forbids every fetch) with the job's
timeline (attempts as bars, incidents as marks coloured by cause), its step rate over time,
the badput breakdown and the incident table."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

from faultwatch.core.goodput import LABELS, PARTS, fmt_s

CAUSE_COLORS = {"error": "#d62728", "hang": "#9467bd", "node-lost": "#8c564b",
                "exit-hang": "#e377c2", "divergence": "#bcbd22", "preemption": "#ff7f0e",
                "operator-stop": "#7f7f7f"}
PART_COLORS = {"productive": "#2ca02c", "startup": "#1f77b4", "checkpoint": "#17becf",
               "eval": "#aec7e8", "hang_silence": "#9467bd", "detection": "#d62728",
               "restart": "#ff7f0e", "lost_work": "#8c564b", "waiting": "#7f7f7f",
               "other": "#c7c7c7"}
W, LEFT, ROW = 900.0, 90.0, 26.0
CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1040px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.goodput{font-size:15px} table{border-collapse:collapse;font-size:13px}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.n{text-align:right} svg text{font:11px system-ui,sans-serif;fill:#444}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


class _X:
    """Event time -> x pixels over [t0, t1]."""

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.span = t0, max(t1 - t0, 1e-6)

    def __call__(self, t: float) -> float:
        return round(LEFT + (min(max(t, self.t0), self.t0 + self.span) - self.t0)
                     / self.span * W, 2)


def _axis(x: _X, y: float) -> list[str]:
    out = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + W}" y2="{y}" stroke="#999"/>']
    for k in range(6):
        t = x.t0 + x.span * k / 5
        out.append(f'<text x="{x(t)}" y="{y + 14}" text-anchor="middle">'
                   f'+{e(fmt_s(t - x.t0))}</text>')
    return out


def timeline(rep: Mapping[str, Any]) -> str:
    """Attempts as bars (start-up, training, checkpoint/eval spans), incidents as marks."""
    acc = rep["account"]
    t0, t1 = acc.get("start_ts"), acc.get("end_ts")
    attempts: Sequence[Mapping[str, Any]] = rep["attempts"]
    if t0 is None or t1 is None or not attempts:
        return "<p>No attempt seen.</p>"
    x = _X(t0, t1)
    h = ROW * len(attempts) + 30
    out = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{LEFT + W + 20}" '
           f'height="{h}" role="img" aria-label="attempts and incidents over time">']
    row_of = {}
    for n, a in enumerate(attempts):
        y = 4 + n * ROW
        row_of[a["attempt"]] = y
        end = attempts[n + 1]["launch_ts"] if n + 1 < len(attempts) else t1
        start = a["launch_ts"]
        first = a["first_step_ts"] if a["first_step_ts"] is not None else end
        out.append(f'<text x="4" y="{y + 14}">attempt {e(a["attempt"])}</text>')
        out.append(f'<rect class="attempt" data-attempt="{e(a["attempt"])}" x="{x(start)}" '
                   f'y="{y}" width="{max(1.0, x(end) - x(start))}" height="{ROW - 8}" '
                   f'fill="#eee" stroke="#bbb"><title>attempt {e(a["attempt"])}: '
                   f'{e(_clock(start))}, {e(a["nodes"])} node(s)</title></rect>')
        part = "startup" if n == 0 and not rep["earlier_attempts"] else "restart"
        out.append(f'<rect x="{x(start)}" y="{y + 3}" width="{max(0.0, x(first) - x(start))}" '
                   f'height="{ROW - 14}" fill="{PART_COLORS[part]}"/>')
        last = a["last_step_ts"] if a["last_step_ts"] is not None else first
        out.append(f'<rect x="{x(first)}" y="{y + 3}" width="{max(0.0, x(last) - x(first))}" '
                   f'height="{ROW - 14}" fill="{PART_COLORS["productive"]}"/>')
        for kind, s, t in a["spans"]:
            color = PART_COLORS["checkpoint" if kind == "checkpoint" else "eval"]
            out.append(f'<rect x="{x(s)}" y="{y + 3}" width="{max(1.0, x(t) - x(s))}" '
                       f'height="{ROW - 14}" fill="{color}"><title>{e(kind)} '
                       f'{e(fmt_s(t - s))}</title></rect>')
    for i in rep["incidents"]:
        y = row_of.get(i["attempt"], 4.0)
        cx, color = x(i["first_sign_ts"]), CAUSE_COLORS.get(i["cause"], "#000")
        dx = x(i["detected_ts"])
        out.append(f'<g class="incident" data-id="{e(i["id"])}" data-cause="{e(i["cause"])}">'
                   f'<line x1="{cx}" y1="{y}" x2="{dx}" y2="{y}" stroke="{color}" '
                   f'stroke-width="3"/><circle cx="{cx}" cy="{y + (ROW - 8) / 2}" r="6" '
                   f'fill="{color}" stroke="#fff"/><title>{e(i["cause"])}: '
                   f'{e(i["rule"] or i["kind"] or "")} at {e(_clock(i["first_sign_ts"]))}; '
                   f'{e(i["lost"])}; {e(i["message"])}</title></g>')
    out += _axis(x, h - 22)
    out.append("</svg>")
    return "".join(out)


def step_rate(rep: Mapping[str, Any]) -> str:
    """Steps per second between consecutive progress samples of one attempt."""
    acc = rep["account"]
    t0, t1 = acc.get("start_ts"), acc.get("end_ts")
    pts: list[tuple[float, float, int]] = []
    samples = rep["samples"]
    for (ta, sa, aa), (tb, sb, ab) in zip(samples, samples[1:], strict=False):
        if aa == ab and tb > ta and sb >= sa:
            pts.append(((ta + tb) / 2, (sb - sa) / (tb - ta), aa))
    if t0 is None or t1 is None or not pts:
        return "<p>No step rate: fewer than two progress samples in one attempt.</p>"
    x, top, h = _X(t0, t1), max(r for _, r, _ in pts) or 1.0, 140.0
    out = [f'<svg id="rate" xmlns="http://www.w3.org/2000/svg" width="{LEFT + W + 20}" '
           f'height="{h + 30}" role="img" aria-label="steps per second over time">',
           f'<text x="4" y="14">{e(f"{top:.3g}")} steps/s</text>',
           f'<text x="4" y="{h}">0</text>']
    for att in sorted({a for _, _, a in pts}):
        line = " ".join(f"{x(t)},{round(h - r / top * (h - 10), 2)}"
                        for t, r, a in pts if a == att)
        out.append(f'<polyline fill="none" stroke="#2ca02c" stroke-width="1.5" '
                   f'points="{line}"/>')
    out += _axis(x, h + 4)
    out.append("</svg>")
    return "".join(out)


def breakdown(rep: Mapping[str, Any]) -> str:
    """The wall time as one stacked bar, then the table of parts."""
    acc = rep["account"]
    wall = acc["wall_s"] or 0.0
    parts = [("productive", acc["productive_s"])] + [(k, acc["badput_s"][k]) for k in PARTS]
    out = [f'<svg id="badput" xmlns="http://www.w3.org/2000/svg" width="{LEFT + W + 20}" '
           f'height="34" role="img" aria-label="wall time by part">']
    at = LEFT
    for k, v in parts:
        w = W * v / wall if wall else 0.0
        if w > 0:
            out.append(f'<rect class="part" data-part="{e(k)}" x="{round(at, 2)}" y="4" '
                       f'width="{round(w, 2)}" height="24" fill="{PART_COLORS[k]}">'
                       f'<title>{e(LABELS.get(k, k))}: {e(fmt_s(v))}</title></rect>')
            at += w
    out.append("</svg><table><tr><th>time</th><th>seconds</th><th>share</th></tr>")
    for k, v in parts:
        share = f"{100 * v / wall:.1f} %" if wall else "-"
        out.append(f'<tr><td><i style="display:inline-block;width:10px;height:10px;'
                   f'background:{PART_COLORS[k]}"></i> {e(LABELS.get(k, k))}</td>'
                   f'<td class="n">{v:.1f}</td><td class="n">{e(share)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def incident_table(rep: Mapping[str, Any]) -> str:
    if not rep["incidents"]:
        return "<p>No incident.</p>"
    out = ["<table><tr><th>first sign</th><th>attempt</th><th>cause</th><th>rule</th>"
           "<th>blamed</th><th>detected</th><th>acted</th><th>recovered</th>"
           "<th>lost work</th></tr>"]
    for i in rep["incidents"]:
        acted = _clock(i["acted_ts"]) + "".join(
            f"<br>{e(a['backend'])} {e(a['action'])} {e(a['node'])} {e(_clock(a['ts']))}"
            for a in i["actuated"])
        out.append(f'<tr><td>{e(_clock(i["first_sign_ts"]))}</td><td>{e(i["attempt"])}</td>'
                   f'<td style="color:{CAUSE_COLORS.get(i["cause"], "#000")}">'
                   f'{e(i["cause"])}</td><td>{e(i["rule"] or i["kind"] or "-")}</td>'
                   f'<td>{e(", ".join(i["nodes"]) or "-")}</td>'
                   f'<td>{e(_clock(i["detected_ts"]))}</td><td>{acted}</td>'
                   f'<td>{e(_clock(i["recovered_ts"]))}</td><td>{e(i["lost"])}</td></tr>')
    out.append("</table>")
    return "".join(out)


def render_html(rep: Mapping[str, Any]) -> str:
    legend = "".join(f'<span><i style="background:{c}"></i>{e(k)}</span>'
                     for k, c in CAUSE_COLORS.items())
    lemons = "".join(f"<li>{e(lem['node'])}: blamed in incidents of "
                     f"{len({b['job'] for b in lem['blames']})} jobs</li>"
                     for lem in rep["lemons"])
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<title>faultwatch report: {e(rep["job"])}</title><style>{STYLE}</style></head>'
            f'<body><h1>{e(rep["job"])}</h1><p>run {e(rep["run_id"] or "-")}</p>'
            f'<p class="goodput">{e(rep["goodput"])}</p>'
            f'<h2>Timeline</h2><p class="legend">{legend}</p>{timeline(rep)}'
            f'<h2>Step rate</h2>{step_rate(rep)}'
            f'<h2>Where the time went</h2>{breakdown(rep)}'
            f'<h2>Incidents</h2>{incident_table(rep)}'
            + (f"<h2>Lemon nodes among this job's nodes</h2><ul>{lemons}</ul>" if lemons else "")
            + '<p>Definitions: docs/goodput.md.</p></body></html>\n')
