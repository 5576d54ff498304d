"""``purefx MODEL.pt2 --rules module:NAME --search``: ``saturate_report`` instead of greedy
``rewrite``; the text gives the search report and the HTML page a search section (costs, why it
stopped, the rewrites kept, the e-graph's growth as an inline SVG chart); ``--search`` without
rules, or with ``--stages``, is one line and status 2. Also ``lowering.plot.line_chart``."""

from __future__ import annotations

import re

import pytest
import torch

from lowering import cli
from lowering.plot import PlotError, line_chart, nice_ceiling

RULES_MODULE = '''
import torch
from transforms.rewrite import Rule

M3 = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 6))
ASSOC = [
    Rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, name="assoc",
         both_ways=True, specials=False, assumes={"reassociate"}, max_examples=10),
]
ASSOC_AND_REVERSE = [
    Rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, name="assoc_forward",
         specials=False, assumes={"reassociate"}, max_examples=10),
    Rule(lambda a, b, c: a @ (b @ c), lambda a, b, c: (a @ b) @ c, M3, name="assoc_back",
         specials=False, assumes={"reassociate"}, max_examples=10),
]
NONE = []
'''


class Chain(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (a @ b) @ c


def _ints(*shape: int) -> torch.Tensor:
    # integer-valued floats: every association sums exactly, so the check compares exactly
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randint(-3, 4, shape, generator=g).float()


def _setup(tmp_path, monkeypatch):
    (tmp_path / "my_search_rules.py").write_text(RULES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    pt2 = tmp_path / "chain.pt2"
    args = (_ints(256, 256), _ints(256, 256), _ints(256, 4))
    torch.export.save(torch.export.export(Chain(), args), pt2)
    return pt2


def _points(page: str, series: int) -> list[tuple[float, float]]:
    found = re.search(rf'<polyline class="series-{series}"[^>]* points="([^"]+)"', page)
    assert found, f"no polyline for series {series}"
    return [tuple(map(float, pair.split(","))) for pair in found.group(1).split()]


@pytest.mark.parametrize("spec", ["my_search_rules:ASSOC", "my_search_rules:ASSOC_AND_REVERSE"])
def test_search_runs_saturate_and_the_report_charts_the_growth(tmp_path, monkeypatch, capsys,
                                                               spec):
    pt2 = _setup(tmp_path, monkeypatch)
    html = tmp_path / "report.html"
    status = cli.main([str(pt2), "--rules", spec, "--assume", "reassociate", "--search",
                       "--html", str(html)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "  saturate " in out and "  rewrite " not in out  # its own stage, not greedy's
    assert "check against ep.module(): PASS" in out
    costs = re.search(r"cost: ([\d.]+) -> ([\d.]+) \(saturate;", out)
    assert costs, out
    before, after = map(float, costs.groups())
    assert after < before  # a @ (b @ c): 256x256x4 twice instead of 256x256x256
    graph = re.search(r"graph 0: e-nodes ([\d ]+); e-classes ([\d ]+); stopped: saturated", out)
    assert graph, out
    enodes = [int(x) for x in graph.group(1).split()]
    eclasses = [int(x) for x in graph.group(2).split()]
    assert len(enodes) == len(eclasses) >= 2 and enodes[-1] > enodes[0]

    page = html.read_text()
    for external in ["<script", "<link", "src=", "@import", "url(", "http://", "https://"]:
        assert external not in page, external
    section = page[page.index('id="search"'):page.index('id="tree"')]
    assert f'id="cost-before">{before:.1f}<' in section
    assert f'id="cost-after">{after:.1f}<' in section
    assert 'id="cost-greedy">' in section and "kept: <b>saturate</b>" in section
    assert "saturated" in section
    rule = "assoc" if spec.endswith("ASSOC") else "assoc_forward"
    assert f'<td class="mono">{rule}</td><td class="num">1</td>' in section
    # one point per round (and the e-graph as built), in both series
    nodes_line, classes_line = _points(section, 0), _points(section, 1)
    assert len(nodes_line) == len(enodes) and len(classes_line) == len(eclasses)
    xs = [x for x, _ in nodes_line]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # left to right, one per round
    ys = [y for _, y in nodes_line]
    assert ys[-1] < ys[0]  # more e-nodes at the end: higher up (SVG's y grows downwards)
    assert 'class="x-label"' in section and "round (0: the e-graph as built)" in section
    assert 'class="y-label"' in section


def test_search_without_rules_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    pt2 = _setup(tmp_path, monkeypatch)
    for argv, said in [
        ([str(pt2), "--search"], "--search searches with the rewrite rules, and none were given"),
        ([str(pt2), "--search", "--rules", "my_search_rules:NONE"], "name them with --rules"),
        ([str(pt2), "--search", "--rules", "my_search_rules:ASSOC", "--stages", "auto:2"],
         "--stages only prints its stage plan"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_run_with_search_and_no_rules_raises():
    from lowering.example_model import example_program

    with pytest.raises(cli.UsageError, match="--search"):
        cli.run(example_program(), rules=(), search=True)


def test_frozen_state_without_search_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    pt2 = _setup(tmp_path, monkeypatch)
    argv = [str(pt2), "--rules", "my_search_rules:ASSOC", "--frozen-state"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--frozen-state" in err and "--search" in err and err.count("\n") == 1, err
    with pytest.raises(cli.UsageError, match="--frozen-state"):
        cli.run(torch.export.export(Chain(), (_ints(2, 2),) * 3), frozen_state=True)


def test_frozen_state_and_verdicts_reach_saturate(tmp_path, monkeypatch, capsys):
    """``--frozen-state`` searches with ``frozen_state=True`` (the report says state is frozen)
    and ``--verdicts`` names the store ``saturate`` reads the verdicts from."""
    from transforms.rewrite import ruleset

    pt2 = _setup(tmp_path, monkeypatch)
    stores = []
    real = ruleset.check_rules

    def recorded(rules, *, verdicts=None, **kw):
        stores.append(verdicts)
        return real(rules, verdicts=verdicts, **kw)

    monkeypatch.setattr(ruleset, "check_rules", recorded)
    store = tmp_path / "store"
    status = cli.main([str(pt2), "--rules", "my_search_rules:ASSOC", "--assume", "reassociate",
                       "--search", "--frozen-state", "--verdicts", str(store)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "state: frozen" in out and str(store) in map(str, stores)


def test_the_help_and_readme_mention_search(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "--search" in capsys.readouterr().out
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--search" in readme


# --- the chart -------------------------------------------------------------------------------------


def test_line_chart_draws_one_point_per_value_from_zero():
    svg = line_chart({"e-nodes": [5, 7, 9], "e-classes": [5, 6, 6]}, x_label="round",
                     y_label="count")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    a, b = _points(svg, 0), _points(svg, 1)
    assert len(a) == 3 and len(b) == 3
    assert [x for x, _ in a] == [x for x, _ in b]  # the same rounds on one x axis
    top = nice_ceiling(9)  # 10
    y0, y9 = a[0][1], a[2][1]
    bottom = y0 + (y9 - y0) * 5 / (5 - 9)  # where 0 is: the y axis is linear
    assert a[2][1] < a[0][1] and abs((bottom - y9) / (bottom - y0) - 9 / 5) < 1e-2
    assert f">{top:.0f}</text>" in svg and ">0</text>" in svg  # the y axis: 0 .. 10
    assert ">round<" in svg and ">count<" in svg and ">e-classes<" in svg


def test_nice_ceiling_is_a_round_number_at_or_above():
    assert [nice_ceiling(x) for x in (0, 1, 3, 7, 11, 26, 2400)] == [
        1.0, 1.0, 5.0, 10.0, 20.0, 50.0, 2500.0]


def test_line_chart_names_a_bad_series():
    with pytest.raises(PlotError, match="no series"):
        line_chart({}, x_label="x", y_label="y")
    with pytest.raises(PlotError, match="'a' has no values"):
        line_chart({"a": []}, x_label="x", y_label="y")
    with pytest.raises(PlotError, match="series 'a' value 1 is nan"):
        line_chart({"a": [1, float("nan")]}, x_label="x", y_label="y")


def test_line_chart_escapes_its_labels():
    svg = line_chart({"<a>": [1]}, x_label="x & y", y_label='"y"')
    assert "&lt;a&gt;" in svg and "x &amp; y" in svg and "&quot;y&quot;" in svg
    assert "<a>" not in svg
