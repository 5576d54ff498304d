"""What a run of the ``purefx`` command found, as text and as one self-contained HTML page.

The page is the researcher's view of a rewrite: the module tree (node counts, which modules are
one shared object, which calls were deduplicated onto one graph), each module's graphs, and what
each pass changed, as a diff of the IR printer's text. It has no scripts and loads nothing: the
styles are inline and the fonts are the reader's own.
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Sequence
from typing import Any

import attrs

from ir.printer import format_graph, format_program
from ir.program import Program
from lowering.lower import dispatch_orders
from lowering.plot import line_chart

MAX_DIFF_LINES = 4000  # per pass; a longer diff is cut, with a note saying how much is left out
MAX_CHARTS = 8  # growth charts in the search section; the table still lists every graph


@attrs.frozen
class Stage:
    """One step of a run: its name, its time, and the Program it left (``None`` for ``lower``)."""

    name: str
    seconds: float
    program: Program | None


@attrs.frozen
class TreeRow:
    """One path of the module tree.

    ``same_as`` is the first path of the module object this path also names (sharing), or
    ``None``; ``calls`` counts the calls of the module and ``graphs`` its distinct graphs, so a
    module with more calls than graphs had calls deduplicated onto one graph.
    """

    path: str
    depth: int
    type_name: str
    nodes: int
    graphs: int
    calls: int
    same_as: str | None

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else "<root>"

    @property
    def deduplicated(self) -> bool:
        return self.graphs > 0 and self.calls > self.graphs

    def summary(self) -> str:
        """``"Block [12 nodes, 3 calls share 1 graph]"`` and the like."""
        if self.same_as is not None:
            return f"{self.type_name} (same object as {self.same_as or '<root>'})"
        if not self.graphs:
            return f"{self.type_name} [no graph]"
        body = f"{self.nodes} nodes"
        if self.deduplicated:
            share = "share 1 graph" if self.graphs == 1 else f"share {self.graphs} graphs"
            body += f", {self.calls} calls {share}"
        elif self.graphs > 1:
            body += f", {self.graphs} call graphs"
        return f"{self.type_name} [{body}]"


def module_rows(program: Program) -> list[TreeRow]:
    """The module tree of ``program``, one row per path, depth first in registration order."""
    calls = {mid: len(order) for mid, order in dispatch_orders(program).items()}
    rows = []
    for path, mid in program.walk():
        mod = program.modules[mid]
        short = (mod.type_name or mod.kind).rsplit(".", 1)[-1]
        depth = path.count(".") + 1 if path else 0
        first = program.first_path(mid)
        same_as = None if first == path else first
        rows.append(
            TreeRow(
                path=path,
                depth=depth,
                type_name=short,
                nodes=sum(len(g) for g in mod.graphs),
                graphs=len(mod.graphs),
                calls=calls.get(mid, 1 if mid == program.root else 0),
                same_as=same_as,
            )
        )
    return rows


def format_module_tree(program: Program) -> str:
    """The module tree as indented text, one line per path."""
    rows = module_rows(program)
    lines = [f"{'  ' * r.depth}{r.name}: {r.summary()}" for r in rows]
    shared = sum(1 for r in rows if r.same_as is not None)
    dedup = sum(1 for r in rows if r.deduplicated and r.same_as is None)
    lines.append(
        f"({program.module_count()} distinct modules, {shared} shared paths, "
        f"{dedup} modules with deduplicated calls)"
    )
    return "\n".join(lines)


# --- the HTML page --------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light; --ink: #1d232b; --dim: #5b6673; --line: #d8dee6; --bg: #f6f8fa;
  --pass: #1a7f37; --fail: #cf222e; --add: #e6ffec; --del: #ffebe9; --hunk: #ddf4ff; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 15px/1.45 system-ui, -apple-system, "Segoe UI",
  Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink); background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 10px; padding-bottom: 4px;
  border-bottom: 1px solid var(--line); }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono",
  "Liberation Mono", monospace; font-size: 13px; }
.source { color: var(--dim); margin: 0 0 12px; word-break: break-all; }
.verdict { display: inline-block; padding: 4px 12px; border-radius: 6px; font-weight: 600;
  color: #fff; }
.verdict.pass { background: var(--pass); } .verdict.fail { background: var(--fail); }
.verdict.skip { background: var(--dim); }
table { border-collapse: collapse; min-width: 640px; }
th, td { text-align: left; padding: 4px 12px 4px 0; border-bottom: 1px solid var(--line); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: inline-block; height: 10px; background: #8ab4f8; border-radius: 2px;
  vertical-align: middle; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 22px; }
ul.tree { padding-left: 0; }
ul.tree li { margin: 2px 0; }
.mname { font-weight: 600; }
.type { color: var(--dim); }
.badge { display: inline-block; font-size: 12px; padding: 0 6px; margin-left: 6px;
  border-radius: 10px; border: 1px solid var(--line); background: var(--bg); color: var(--dim); }
.badge.shared { border-color: #d4a72c; background: #fff8c5; color: #7d4e00; }
.badge.dedup { border-color: #54aeff; background: #ddf4ff; color: #0550ae; }
details { border: 1px solid var(--line); border-radius: 6px; margin: 8px 0; background: #fff; }
details > summary { cursor: pointer; padding: 6px 10px; background: var(--bg); }
details[open] > summary { border-bottom: 1px solid var(--line); }
pre { margin: 0; padding: 8px 10px; overflow-x: auto; white-space: pre; }
pre.diff span { display: block; }
pre.diff .add { background: var(--add); } pre.diff .del { background: var(--del); }
pre.diff .hunk { background: var(--hunk); color: var(--dim); }
.stat-add { color: var(--pass); } .stat-del { color: var(--fail); }
.note { color: var(--dim); font-style: italic; }
h3 { font-size: 15px; margin: 18px 0 6px; }
figure { margin: 12px 0; } figcaption { color: var(--dim); font-size: 13px; }
svg.chart text { font-family: inherit; }
"""


def html_report(
    *,
    source: str,
    stages: Sequence[Stage],
    verdict: str,
    passed: bool | None,
    rewrites: Any = None,
    search: Any = None,
) -> str:
    """The whole page for one run: ``stages`` from ``import_ep`` to ``lower``; ``passed`` is
    ``None`` when the check was skipped; ``rewrites`` (a ``transforms.rewrite.RewriteReport``,
    optional) adds a section listing each rewrite: the rule, the module and graph, and the nodes
    it replaced; ``search`` (a ``transforms.rewrite.SaturationReport``, optional) adds one on
    the search: cost before and after (and greedy ``rewrite``'s), which program was kept, why
    each graph's saturation stopped, the rewrites in the extracted program, and the e-graph's
    growth per round (e-nodes and e-classes) as an inline SVG chart per graph that grew."""
    final = next(s.program for s in reversed(stages) if s.program is not None)
    kind = "skip" if passed is None else ("pass" if passed else "fail")
    texts = _stage_texts(stages)
    rows = module_rows(final)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>purefx report: {_e(source)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<header><h1>purefx report</h1>",
        f'<p class="source mono">{_e(source)}</p>',
        f'<p><span class="verdict {kind}" id="verdict">{_e(verdict)}</span></p></header>',
        _stage_table(stages, texts),
        _rewrites_section(rewrites),
        _search_section(search),
        _tree_section(rows),
        _graphs_section(final, rows),
        _diff_section(stages, texts),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _rewrites_section(report: Any) -> str:
    if report is None:
        return ""
    counts = ", ".join(f"{_e(k)}: {v}" for k, v in report.counts.items())
    rows = "".join(
        f'<tr><td class="mono">{_e(r.rule)}</td><td class="mono">{_e(r.module or "<root>")}'
        f'</td><td>{r.graph}</td><td class="mono">{_e(", ".join("%" + n for n in r.replaced))}'
        "</td></tr>"
        for r in report.rewrites
    )
    return (
        '<section id="rewrites"><h2>Rewrites</h2>'
        f"<p>{counts or 'no rules'}</p>"
        "<table><thead><tr><th>rule</th><th>module</th><th>graph</th><th>replaced nodes</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _search_section(report: Any) -> str:
    if report is None:
        return ""
    greedy = "raised" if report.greedy_cost is None else f"{report.greedy_cost:.1f}"
    saved = (1 - report.cost_after / report.cost_before) if report.cost_before else 0.0
    out = [
        '<section id="search"><h2>Search (equality saturation)</h2>',
        ('<table class="costs"><thead><tr><th>cost (roofline µs)</th><th class="num">value</th>'
        "</tr></thead><tbody>"),
        f'<tr><td>before</td><td class="num" id="cost-before">{report.cost_before:.1f}</td></tr>',
        f'<tr><td>after</td><td class="num" id="cost-after">{report.cost_after:.1f}</td></tr>',
        (f'<tr><td>greedy <code>rewrite</code>, same rules</td><td class="num" '
        f'id="cost-greedy">{greedy}</td></tr></tbody></table>'),
        (f"<p>kept: <b>{_e(report.chosen)}</b> ({_CHOSEN.get(report.chosen, '')}); "
        f"{100 * saved:.1f} % cheaper; extraction: {_e(report.extractor)}</p>"),
    ]
    rewrites = "".join(
        f'<tr><td class="mono">{_e(k)}</td><td class="num">{v}</td></tr>'
        for k, v in report.rewrites.items()
    )
    out.append(
        "<h3>Rewrites in the extracted program</h3>"
        + (
            "<table><thead><tr><th>rule</th><th class=\"num\">values computed by its "
            f"replacement</th></tr></thead><tbody>{rewrites}</tbody></table>"
            if rewrites else '<p class="note">none</p>'
        )
    )
    if report.skipped_rules:
        items = "".join(
            f'<li><span class="mono">{_e(k)}</span>: {_e(v)}</li>'
            for k, v in report.skipped_rules.items()
        )
        out.append(f"<p>not applied:</p><ul>{items}</ul>")
    classes = report.classes or tuple(() for _ in report.sizes)
    rows = []
    charts = []
    for i, (sizes, counted, why) in enumerate(zip(report.sizes, classes, report.stopped)):
        rows.append(
            f'<tr><td class="num">{i}</td><td class="num">{len(sizes) - 1}</td>'
            f'<td class="num">{sizes[0]}</td><td class="num">{sizes[-1]}</td>'
            f'<td class="num">{counted[-1] if counted else ""}</td>'
            f"<td>{_e(why)} <span class=\"note\">{_e(_STOPPED.get(why, ''))}</span></td></tr>"
        )
        if len(charts) < MAX_CHARTS and sizes[-1] != sizes[0]:
            series = {"e-nodes": list(sizes)}
            if counted:
                series["e-classes"] = list(counted)
            charts.append(
                f'<figure id="growth-{i}">' + line_chart(
                    series, x_label="round (0: the e-graph as built)", y_label="count",
                    title=f"graph {i}: the e-graph's growth per round", zero=False,
                ) + f"<figcaption>graph {i}: e-nodes and e-classes per round "
                f"(stopped: {_e(why)})</figcaption></figure>"
            )
    grew = sum(1 for sizes in report.sizes if sizes[-1] != sizes[0])
    out.append(
        "<h3>The e-graphs</h3><table><thead><tr><th class=\"num\">graph</th>"
        '<th class="num">rounds</th><th class="num">e-nodes built</th>'
        '<th class="num">e-nodes at the end</th><th class="num">e-classes at the end</th>'
        f"<th>stopped</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    out.extend(charts)
    if grew > len(charts):
        out.append(f'<p class="note">&nbsp;{grew - len(charts)} more graphs grew; '
                   f"charts for the first {len(charts)}</p>")
    out.append("</section>")
    return "".join(out)


_CHOSEN = {
    "saturate": "the program extracted from the e-graph",
    "greedy": "greedy rewrite's program was cheaper",
    "original": "nothing cheaper was found: the program as it was",
}
_STOPPED = {
    "saturated": "(a round added nothing)",
    "nodes": "(the e-node limit)",
    "iterations": "(the round limit)",
    "seconds": "(the time limit)",
}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _stage_texts(stages: Sequence[Stage]) -> list[str | None]:
    """The printer's text of each stage's Program (formatted once per distinct Program)."""
    cache: dict[int, str] = {}
    texts: list[str | None] = []
    for stage in stages:
        if stage.program is None:
            texts.append(None)
            continue
        key = id(stage.program)
        if key not in cache:
            cache[key] = format_program(stage.program)
        texts.append(cache[key])
    return texts


def _diff(before: str, after: str) -> list[str]:
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), "before", "after", n=3, lineterm=""
    )
    return list(lines)[2:]  # without the two file header lines


def _stage_table(stages: Sequence[Stage], texts: list[str | None]) -> str:
    longest = max((s.seconds for s in stages), default=0.0) or 1.0
    rows = []
    previous: str | None = None
    for stage, text in zip(stages, texts):
        p = stage.program
        if text is None or previous is None:
            change = "" if text is None else "imported"
        elif text == previous:
            change = "no change"
        else:
            change = _diff_counts(_diff(previous, text))
        if text is not None:
            previous = text
        width = max(1, round(160 * stage.seconds / longest))
        rows.append(
            "<tr>"
            f'<td class="mono">{_e(stage.name)}</td>'
            f'<td class="num">{1e3 * stage.seconds:.2f}</td>'
            f'<td><span class="bar" style="width:{width}px"></span></td>'
            f'<td class="num">{"" if p is None else p.node_count()}</td>'
            f'<td class="num">{"" if p is None else p.module_count()}</td>'
            f"<td>{change}</td></tr>"
        )
    return (
        '<section id="stages"><h2>Passes</h2><table><thead><tr><th>stage</th>'
        '<th class="num">ms</th><th></th><th class="num">nodes</th><th class="num">modules</th>'
        "<th>IR text</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>"
    )


def _tree_section(rows: list[TreeRow]) -> str:
    anchors = _anchors(rows)
    out = ['<section id="tree"><h2>Module tree</h2><ul class="tree">']
    depth = 0
    for i, row in enumerate(rows):
        if i:
            if row.depth > depth:
                out.append("<ul>" * (row.depth - depth))
            else:
                out.append("</li>" + "</ul></li>" * (depth - row.depth))
        depth = row.depth
        name = _e(row.name)
        target = anchors.get(row.path if row.same_as is None else row.same_as)
        label = f'<a class="mname mono" href="#{target}">{name}</a>' if target else (
            f'<span class="mname mono">{name}</span>'
        )
        badges = ""
        if row.same_as is not None:
            first = _e(row.same_as or "<root>")
            badges += f'<span class="badge shared">same object as {first}</span>'
        else:
            detail = f"{row.nodes} nodes" if row.graphs else "no graph"
            badges += f'<span class="badge">{detail}</span>'
            if row.deduplicated:
                badges += (
                    f'<span class="badge dedup">{row.calls} calls &rarr; {row.graphs} '
                    f'graph{"s" if row.graphs > 1 else ""}</span>'
                )
            elif row.graphs > 1:
                badges += f'<span class="badge">{row.graphs} call graphs</span>'
        out.append(f'<li>{label} <span class="type">{_e(row.type_name)}</span>{badges}')
    out.append("</li>" + "</ul></li>" * depth + "</ul></section>")
    return "".join(out)


def _anchors(rows: list[TreeRow]) -> dict[str, str]:
    """The anchor of each module (by first path) that has graphs."""
    firsts = [row.path for row in rows if row.same_as is None and row.graphs]
    return {path: f"module-{i}" for i, path in enumerate(firsts)}


def _graphs_section(program: Program, rows: list[TreeRow]) -> str:
    # ``rows`` is ``module_rows(program)``: one row per path of ``program.walk()``, in order
    anchors = _anchors(rows)
    out = ['<section id="graphs"><h2>Module graphs</h2>']
    for row, (path, mid) in zip(rows, program.walk()):
        anchor = anchors.get(path)
        if anchor is None:
            continue
        mod = program.modules[mid]
        out.append(
            f'<details id="{anchor}"{" open" if not path else ""}><summary>'
            f'<span class="mname mono">{_e(path or "<root>")}</span> '
            f'<span class="type">{_e(row.type_name)} &middot; {row.nodes} nodes'
            f'{f" &middot; {row.graphs} graphs" if row.graphs > 1 else ""}</span>'
            "</summary>"
        )
        for i, graph in enumerate(mod.graphs):
            if len(mod.graphs) > 1:
                out.append(f'<p class="note">&nbsp;graph {i}</p>')
            out.append(f"<pre>{_e(format_graph(graph))}</pre>")
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


def _diff_section(stages: Sequence[Stage], texts: list[str | None]) -> str:
    out = ['<section id="diffs"><h2>What each pass changed</h2>']
    previous: str | None = None
    for stage, text in zip(stages, texts):
        if text is None:
            continue
        if previous is None:
            out.append(
                f'<details><summary>{_e(stage.name)}: the imported program '
                f'({text.count(chr(10)) + 1} lines)</summary>{_pre_lines(text.splitlines())}'
                "</details>"
            )
        elif text == previous:
            out.append(
                f'<details><summary>{_e(stage.name)}: no change</summary>'
                '<p class="note">&nbsp;the printed program is the same</p></details>'
            )
        else:
            diff = _diff(previous, text)
            out.append(f"<details open><summary>{_e(stage.name)}: {_diff_counts(diff)}</summary>"
                       f"{_pre_diff(diff)}</details>")
        previous = text
    out.append("</section>")
    return "".join(out)


def _diff_counts(diff: list[str]) -> str:
    """The lines ``diff`` (a unified diff) adds and removes, as the page shows them."""
    added = sum(1 for line in diff if line.startswith("+"))
    removed = sum(1 for line in diff if line.startswith("-"))
    return (f'<span class="stat-add">+{added}</span> '
            f'<span class="stat-del">&minus;{removed}</span> lines')


def _pre_lines(lines: list[str]) -> str:
    shown = lines[:MAX_DIFF_LINES]
    note = _cut_note(len(lines) - len(shown))
    return f"<pre>{_e(chr(10).join(shown))}</pre>{note}"


def _pre_diff(diff: list[str]) -> str:
    shown = diff[:MAX_DIFF_LINES]
    spans = []
    for line in shown:
        cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
        spans.append(f'<span class="{cls}">{_e(line) or " "}</span>')
    return f'<pre class="diff">{"".join(spans)}</pre>{_cut_note(len(diff) - len(shown))}'


def _cut_note(left_out: int) -> str:
    if left_out <= 0:
        return ""
    return f'<p class="note">&nbsp;{left_out} more lines left out</p>'
