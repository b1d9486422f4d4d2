"""A turn's span tree as a picture (SVG): one row per span, indented by depth, a bar from
its start to its end on the turn's working time; each wait for the owner between runs is
a narrow grey gap, in no bar. What `manage.py traces TURN --svg PATH` writes (and the README shows)."""

from __future__ import annotations

from xml.sax.saxutils import escape

from orchestration.reports.traces import CLIENT, Span

ROW, LABEL, BAR, PAD, GAP = 18, 330, 560, 8, 24
COLOURS = {"invoke_workflow": "#5b6b7f", "invoke_agent": "#3d7cc9", "chat": "#3a9a5b", "execute_tool": "#d08a2c"}
EVENT = "#8a5cc2"


def trace_svg(roots: list[Span]) -> str:
    rows = [(depth, span) for root in roots for depth, span in root.walk()]
    if not rows:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
    # The axis is working time: each wait between runs is drawn as a narrow gap, whatever
    # its length (an approval may come a day later).
    runs = [(root.start, root.end) for root in roots]
    work = max(sum((end - begin).total_seconds() for begin, end in runs), 1e-6)
    width = BAR - GAP * (len(runs) - 1)

    def x(moment) -> float:
        done = sum(max(0.0, (min(end, moment) - begin).total_seconds()) for begin, end in runs)
        gaps = sum(1 for end, _ in zip((end for _, end in runs), runs[1:]) if moment > end)  # a wait's answer: after it
        return LABEL + width * done / work + GAP * gaps

    height = PAD * 2 + ROW * (len(rows) + 2)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL + BAR + PAD * 2}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="#fff"/>']
    for (_, end), (begin, _) in zip(runs, runs[1:]):  # the owner's wait: no span runs through it
        waited = (begin - end).total_seconds()
        parts.append(f'<rect x="{x(end) + 2:.1f}" y="{PAD}" width="{GAP - 4}" height="{height - PAD * 2}" '
                     f'fill="#e4e4e4"><title>paused {waited:.1f} s: waiting for the owner</title></rect>')
    for row, (depth, span) in enumerate(rows):
        y = PAD + ROW * row
        colour = "#c0392b" if span.error else COLOURS.get(span.name.split(" ", 1)[0], "#777")
        took = (span.end - span.start).total_seconds()
        label = f"{span.name}{'  ↪' if span.links else ''}"
        parts.append(f'<text x="{PAD + 12 * depth}" y="{y + 13}">{escape(label[:52])}</text>')
        opacity = ' opacity="0.8"' if span.kind == CLIENT else ""
        failed = escape(f" — error {span.error}") if span.error else ""
        parts.append(f'<rect x="{x(span.start):.1f}" y="{y + 3}" width="{max(x(span.end) - x(span.start), 1.5):.1f}" '
                     f'height="{ROW - 6}" rx="2" fill="{colour}"{opacity}>'
                     f'<title>{escape(span.name)}: {took:.3f} s{failed}</title></rect>')
        for event in span.events:  # a diamond on the span's row: the owner's verdict
            verdict = event.attributes.get("gen_ai.guardrail.result.value", "")
            cx, cy = x(event.at), y + ROW / 2
            parts.append(f'<path d="M{cx:.1f} {cy - 6:.1f} l6 6 l-6 6 l-6 -6 z" fill="{EVENT}">'
                         f'<title>{escape(event.name)}: {escape(str(verdict))}</title></path>')
    y = PAD + ROW * len(rows) + 13
    parts.append(f'<text x="{LABEL}" y="{y}" fill="#555">0 s</text>')
    parts.append(f'<text x="{LABEL + BAR}" y="{y}" fill="#555" text-anchor="end">{work:.2f} s of work</text>')
    parts.append(f'<text x="{PAD}" y="{y + ROW}" fill="#555">↪ follows an earlier span (a run after a pause, '
                 f'an agent going on, a retried call); ◆ the owner\'s verdict</text>')
    parts.append("</svg>")
    return "\n".join(parts)
