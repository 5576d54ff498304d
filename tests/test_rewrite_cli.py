"""``purefx MODEL.pt2 --rules module:NAME``: rules from the user's module run after the default
pipeline; the text and HTML reports list each rewrite; a bad spec is one line and status 2."""

from __future__ import annotations

import torch

from lowering import cli

RULES_MODULE = '''
import torch
from transforms.rewrite import Rule

RULES = [
    Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(3, 4),), name="relu_relu",
         max_examples=10),
]
ASSUMING = [
    Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(3, 4),), name="rr_fast",
         trusted=True, assumes={"no_nans"}),
]
NOT_RULES = 3
'''


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.relu(torch.relu(self.lin(x))))


def _setup(tmp_path, monkeypatch):
    (tmp_path / "my_rules_for_cli.py").write_text(RULES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    pt2 = tmp_path / "chain.pt2"
    torch.export.save(torch.export.export(Chain(), (torch.randn(2, 4),)), pt2)
    return pt2


def test_rules_run_after_the_pipeline_and_reports_list_each_rewrite(tmp_path, monkeypatch,
                                                                     capsys):
    pt2 = _setup(tmp_path, monkeypatch)
    html = tmp_path / "report.html"
    status = cli.main([str(pt2), "--rules", "my_rules_for_cli:RULES", "--html", str(html)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "rewrites: relu_relu 2" in out
    assert "  rewrite " in out  # its own stage, after the pipeline
    assert "check against ep.module(): PASS" in out
    page = html.read_text()
    assert 'id="rewrites"' in page and "relu_relu: 2" in page
    assert page.count("<td class=\"mono\">relu_relu</td>") == 2


def test_a_bad_rules_spec_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    pt2 = _setup(tmp_path, monkeypatch)
    for spec, said in [
        ("my_rules_for_cli", "expected MODULE:NAME"),
        ("no_such_module_xyz:RULES", "cannot import"),
        ("my_rules_for_cli:NOT_RULES", "is int, expected a transforms.rewrite.Rule"),
    ]:
        assert cli.main([str(pt2), "--rules", spec]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_assume_grants_the_rules_assumptions(tmp_path, monkeypatch, capsys):
    pt2 = _setup(tmp_path, monkeypatch)
    assert cli.main([str(pt2), "--rules", "my_rules_for_cli:ASSUMING"]) == 0
    out = capsys.readouterr().out
    assert "rewrites: rr_fast 0" in out
    assert "not applied: rr_fast assumes no_nans (grant with --assume)" in out
    assert cli.main([str(pt2), "--rules", "my_rules_for_cli:ASSUMING", "--assume", "no_nans"]) == 0
    assert "rewrites: rr_fast 2" in capsys.readouterr().out
    assert cli.main([str(pt2), "--rules", "my_rules_for_cli:ASSUMING", "--assume", "fast"]) == 2
    err = capsys.readouterr().err
    assert "--assume: unknown assumption(s) ['fast']" in err and err.count("\n") == 1


def test_the_help_says_what_the_attention_set_needs_granted(capsys):
    from transforms.rewrite_rules import ATTENTION_ASSUMES

    try:
        cli.main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    assert "--assume " + ",".join(sorted(ATTENTION_ASSUMES)) in " ".join(out.split())


def test_verdicts_are_kept_where_verdicts_says(tmp_path, monkeypatch, capsys):
    """``--verdicts DIR`` files the rules' verdicts there (a second run reads them);
    ``--verdicts off`` keeps none."""
    pt2 = _setup(tmp_path, monkeypatch)
    # rules of their own (a module no other test imported): no verdict in memory yet
    (tmp_path / "my_rules_for_verdicts.py").write_text(RULES_MODULE)
    store = tmp_path / "verdicts"
    args = [str(pt2), "--rules", "my_rules_for_verdicts:RULES", "--verdicts", str(store)]
    assert cli.main(args) == 0, capsys.readouterr().out
    entries = list(store.glob("*.json"))
    assert len(entries) == 1 and '"verdict": "right"' in entries[0].read_text()
    assert cli.main(args) == 0  # read back (the same key): nothing new filed
    assert list(store.glob("*.json")) == entries
    off = tmp_path / "off_cache"
    monkeypatch.setenv("PUREFX_VERDICTS", str(off))
    assert cli.main([*args[:3], "--verdicts", "off"]) == 0
    assert not off.exists()
    assert cli._verdicts("OFF") is False and cli._verdicts(None) is None
