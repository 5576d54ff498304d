"""Verdicts that depend on the rule, not its name, and persist (issue 54, item 1):
``rule_key`` (the content key and the seed), ``verdict_store`` (the store on disk, the shipped
verdicts) and ``verdicts.check_rules`` (memory, shipped, store, else checked over a pool)."""

from __future__ import annotations

import json
import multiprocessing
import os

import attrs
import pytest
import torch

from ir import PassError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule, rewrite, rule_check, rule_key
from transforms.rewrite import verdicts as verdicts_module
from transforms.rewrite.api import ensure_checked, rule_verdict
from transforms.rewrite.rule_key import (
    code_digest,
    rule_content,
    rule_seed,
    torch_line,
    verdict_key,
    versions,
)
from transforms.rewrite.rules import RELU_RELU, SHARED_INPUT_ASSUMES, SHARED_INPUT_MM, TIMES_ONE
from transforms.rewrite.verdict_store import (
    ENV,
    SHIPPED,
    Stored,
    VerdictStore,
    checksum,
    default_directory,
    parse,
    shipped,
    shipped_lines,
    shipped_sections,
    store_for,
    write_shipped,
)
from transforms.rewrite.verdicts import NoShippedVerdicts, check_rules, drifted, shipped_rules

X = (torch.randn(3, 4),)


def _neg_neg(x):
    return torch.neg(torch.neg(x))


def _same(x):
    return x


def _user_rule(name: str = "neg_neg") -> Rule:
    """A user's own right rule, cheap to check: a new object each call (a "new process")."""
    return Rule(_neg_neg, _same, X, name=name, max_examples=4)


def _wrong_rule(name: str = "plus_zero") -> Rule:
    return Rule(lambda x: x + 0.0, lambda x: x, X, name=name, max_examples=4)


# --- the content key ------------------------------------------------------------------------------


def test_the_key_ignores_the_name_and_follows_the_content():
    base = _user_rule("zz_rule_name")
    renamed = attrs.evolve(base, name="something_else")
    assert rule_seed(renamed) == rule_seed(base) and verdict_key(renamed) == verdict_key(base)
    assert "zz_rule_name" not in rule_content(base)
    # each part of the content moves the key
    others = [
        attrs.evolve(base, assumes={"no_nans"}),
        attrs.evolve(base, specials=False),
        attrs.evolve(base, max_examples=5),
        attrs.evolve(base, where=lambda m: True),
        Rule(_neg_neg, _same, (torch.randn(3, 5),), max_examples=4),  # another signature
        Rule(_neg_neg, torch.clone, X, max_examples=4),  # another replacement
    ]
    keys = {verdict_key(r) for r in others}
    assert verdict_key(base) not in keys and len(keys) == len(others)


def test_the_key_follows_a_closure_and_a_helper_but_not_the_example_values():
    def ranked(k):  # k reaches only the where's closure, which no trace shows
        return Rule(_neg_neg, _same, X, where=lambda m: m.val(0).dim() >= k, max_examples=4)

    assert rule_seed(ranked(1)) != rule_seed(ranked(2))
    assert rule_seed(ranked(1)) == rule_seed(ranked(1))
    again = Rule(_neg_neg, _same, (torch.randn(3, 4),), name="x", max_examples=4)
    assert verdict_key(again) == verdict_key(_user_rule())  # other example values, same key


def test_renaming_a_shipped_rule_keeps_its_verdict():
    """The reported case: the shipped rule under another name. Its key is its own, so the
    shipped verdict applies (no check runs), and ``check_rule`` draws alike under any name."""
    renamed = attrs.evolve(SHARED_INPUT_MM, name="shared_mm_ok")
    assert verdict_key(renamed) == verdict_key(SHARED_INPUT_MM)
    assert check_rules([renamed], verdicts=False) == (True,)


@pytest.mark.slow
def test_check_rule_accepts_the_shared_input_rule_under_another_name():
    """It was refused under this name (float64 rows near 1.8e308: the fused sum overflows
    where the separate ones do not); the rule now says so (``SHARED_INPUT_ASSUMES``), and the
    name no longer moves the draws."""
    assert SHARED_INPUT_MM.assumes == SHARED_INPUT_ASSUMES
    assert check_rule(attrs.evolve(SHARED_INPUT_MM, name="shared_mm_ok")).rewritten > 0


# --- the store ------------------------------------------------------------------------------------


def test_the_store_keeps_a_verdict_and_ignores_every_entry_not_to_trust(tmp_path):
    store = VerdictStore(tmp_path)
    now = versions()
    key = "ab" * 32
    right = Stored(True, "", 10, 8, (), "r")
    assert store.get(key, now) is None
    assert store.put(key, now, right) and store.get(key, now) == right
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.json"]  # no temporary left
    path = tmp_path / f"{key}.json"
    body = json.loads(path.read_text())

    def bad(text: str) -> None:
        path.write_text(text)
        assert store.get(key, now) is None, text[:60]

    bad(path.read_text()[:40])  # truncated
    bad("not json at all")
    bad("\xff\xfe")
    bad(json.dumps({**body, "verdict": "wrong", "detail": "x"}))  # edited: checksum differs
    forged = {**body, "key": "cd" * 32}
    bad(json.dumps(forged))  # filed under another key
    for field in ("checker", "torch"):  # another version
        other = {**body, field: "0"}
        other["sum"] = checksum(other)
        bad(json.dumps(other))
    empty = {**body, "ran": 0, "rewritten": 0}
    empty["sum"] = checksum(empty)
    bad(json.dumps(empty))  # a right verdict that checked nothing
    assert store.get("../escape", now) is None and not store.put("../escape", now, right)


def test_where_the_store_is(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "xdg" / "purefx" / "verdicts"
    monkeypatch.delenv(ENV, raising=False)
    assert store_for().directory == default_directory()
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert store_for().directory == tmp_path / "env"
    assert store_for(tmp_path / "arg").directory == tmp_path / "arg"  # the argument wins
    assert store_for(False) is None
    for off in ("off", "OFF", "0", "none", ""):
        monkeypatch.setenv(ENV, off)
        assert store_for() is None
    with pytest.raises(TypeError, match="verdicts must be"):
        store_for(3)


def test_the_suite_never_writes_the_users_cache():
    import os

    assert os.environ.get(ENV) is not None  # tests/conftest.py sets a store of its own


def test_a_second_process_reads_the_verdict_without_checking(tmp_path, monkeypatch):
    first = _user_rule()
    assert check_rules([first], verdicts=tmp_path) == (True,)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["verdict"] == "right"

    def no_check(rule):
        raise AssertionError("check_rule ran")

    monkeypatch.setattr(verdicts_module, "check_rule", no_check)
    again = _user_rule("renamed")  # a new object, as in a new process, under another name
    assert check_rules([again], verdicts=tmp_path) == (True,)
    assert rule_verdict(again) is True
    # a corrupt entry is not trusted: the rule is checked again and the entry written anew
    files[0].write_text("{")
    with pytest.raises(PassError, match="check_rule ran"):  # a check that broke, as said
        check_rules([_user_rule()], verdicts=tmp_path)
    monkeypatch.undo()
    assert check_rules([_user_rule()], verdicts=tmp_path) == (True,)
    assert json.loads(files[0].read_text())["verdict"] == "right"


def test_a_stored_wrong_verdict_is_raised_under_the_rules_own_name(tmp_path, monkeypatch):
    (found,) = check_rules([_wrong_rule()], verdicts=tmp_path)
    assert isinstance(found, LawViolation)
    monkeypatch.setattr(verdicts_module, "check_rule", lambda r: pytest.fail("checked"))
    renamed = _wrong_rule("mine")
    with pytest.raises(PassError, match="rule 'mine' is wrong") as info:
        rewrite(_program(), [renamed], verdicts=tmp_path)
    assert "got 0.0" in str(info.value) or "-0.0" in str(info.value)
    assert isinstance(rule_verdict(renamed), LawViolation)


def test_no_store_keeps_nothing_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ensure_checked(_user_rule())
    assert not any(tmp_path.iterdir())


def _program():
    from ir import import_ep

    class M(torch.nn.Module):
        def forward(self, x):
            return x + 0.0

    return import_ep(torch.export.export(M(), X))


# --- several rules over a pool --------------------------------------------------------------------


def test_a_pool_checks_several_rules_and_every_process_ends(tmp_path):
    rules = [_user_rule(), _wrong_rule(),
             Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, max_examples=4)]
    found = check_rules(rules, verdicts=tmp_path, workers=2)
    assert found[0] is True and isinstance(found[1], LawViolation) and found[2] is True
    assert multiprocessing.active_children() == []
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_a_malformed_rule_raises_its_own_error_from_the_pool():
    bad = Rule(_neg_neg, _same, X, name="where_raises", where=lambda m: 1 // 0)
    with pytest.raises(PassError, match="where_raises.*ZeroDivisionError"):
        check_rules([_user_rule(), bad], verdicts=False, workers=2)
    assert multiprocessing.active_children() == []


def test_no_pool_once_cuda_is_initialized(tmp_path, monkeypatch):
    """A forked child cannot use CUDA again once the parent initialized it (seen on an H100:
    every check failed with 'Cannot re-initialize CUDA in forked subprocess' and the shipped
    rules were called wrong): the rules are then checked here, in this process."""
    seen = tmp_path / "pids"

    def where(m):
        with open(seen, "a") as f:
            f.write(f"{os.getpid()}\n")
        return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    rules = [Rule(_neg_neg, _same, X, name="here_a", where=where, max_examples=4),
             Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, where=where,
                  max_examples=4)]
    found = check_rules(rules, verdicts=False, workers=2)
    assert found == (True, True)
    assert {int(p) for p in seen.read_text().split()} == {os.getpid()}


def test_a_workers_wrong_verdict_is_confirmed_here_before_it_is_kept(tmp_path, monkeypatch):
    """A worker that called a right rule wrong (its process broke, not the rule) is
    overruled by the check in this process, and the store keeps the right verdict."""
    rules = [_user_rule(), Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X,
                                max_examples=4)]
    monkeypatch.setattr(verdicts_module, "_in_pool", lambda rs, n: [
        Stored(False, "the worker broke", rule=r.name) for r in rs])
    found = check_rules(rules, verdicts=tmp_path, workers=2)
    assert found == (True, True)
    assert all(json.loads(f.read_text())["verdict"] == "right" for f in tmp_path.glob("*.json"))


def test_workers_must_be_a_positive_int():
    with pytest.raises(PassError, match="workers"):
        check_rules([_user_rule()], verdicts=False, workers=0)


# --- the shipped verdicts -------------------------------------------------------------------------


SHIPPED_LINES = ("2.13", "2.14", "2.15")
"""The torch lines whose verdicts ship: each release line of ``pyproject.toml``'s range."""


def test_the_shipped_verdicts_are_well_formed_for_each_torch_line():
    """Each section: the current checker, computed on a torch of its line (hypothesis and
    Python recorded), one right verdict per shipped rule, each entry one ``parse`` trusts
    under its own key and versions, and nothing else in the file."""
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert set(data) == {"format", "torch"} and set(data["torch"]) == set(SHIPPED_LINES)
    checker = versions()[0]
    assert shipped_lines(checker) == SHIPPED_LINES, "the checker changed: regenerate"
    n = len(shipped_rules())
    for line, section in shipped_sections().items():
        assert set(section) == {"checker", "computed_on", "entries"}, line
        made = section["computed_on"]
        assert set(made) == {"torch", "hypothesis", "python"} and torch_line(made["torch"]) == line
        entries = section["entries"]
        assert len(entries) == n, (line, len(entries), n)
        for key, body in entries.items():
            found = parse(body, key, (checker, line))
            assert found is not None and found.right and found.rewritten > 0, (line, key)


def test_every_shipped_rule_has_a_shipped_verdict_for_its_key():
    """Fails when a shipped rule or the checker changed without the shipped verdicts being
    regenerated (``python -m transforms.rewrite.verdicts --write`` under each shipped torch
    line). Under a torch line outside them (a torch released since) the rules are checked at
    first use, which is no drift: the test then skips, naming the line."""
    if versions()[1] not in shipped_lines(versions()[0]):
        pytest.skip(f"no verdicts ship for torch {versions()[1]} "
                    f"(they ship for {shipped_lines(versions()[0])})")
    rules = shipped_rules()
    assert {RELU_RELU, SHARED_INPUT_MM} <= set(rules)
    assert drifted(rules, [verdict_key(r) for r in rules], [None] * len(rules)) == []
    assert all(shipped(verdict_key(r), versions()).right for r in rules)


def test_write_shipped_keeps_the_other_lines_and_drops_another_checkers(tmp_path):
    path = tmp_path / "shipped.json"
    right = Stored(True, "", 3, 2, (), "r")
    made = {"torch": "x", "hypothesis": "y", "python": "z"}
    assert write_shipped({"ab" * 32: right}, ("c1", "2.13"), made, path) == ()
    assert write_shipped({"cd" * 32: right}, ("c1", "2.14"), made, path) == ()
    assert shipped_lines("c1", path) == ("2.13", "2.14")
    assert write_shipped({"ef" * 32: right}, ("c2", "2.14"), made, path) == ("2.13",)
    assert shipped_lines("c2", path) == ("2.14",) and shipped_lines("c1", path) == ()


# --- what the key holds: no hypothesis version, no torch patch, no Python bytecode ---------------


def test_the_key_holds_no_hypothesis_version(monkeypatch):
    """A simulated other hypothesis release (its version everywhere it can be read) keys every
    rule alike, and the shipped verdicts still hit."""
    import importlib.metadata

    import hypothesis

    before = {r.name: verdict_key(r) for r in (RELU_RELU, TIMES_ONE)}
    real = importlib.metadata.version
    monkeypatch.setattr(hypothesis, "__version__", "6.100.0")
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "6.100.0" if name == "hypothesis" else real(name))
    assert len(versions()) == 2 and "6.100.0" not in versions()
    fresh = [attrs.evolve(r, name=r.name) for r in (RELU_RELU, TIMES_ONE)]  # no kept key
    assert {r.name: verdict_key(r) for r in fresh} == before
    if versions()[1] in shipped_lines(versions()[0]):
        assert all(shipped(verdict_key(r), versions()).right for r in fresh)


def test_no_verdict_depends_on_hypothesis(monkeypatch):
    """Hypothesis never decides a verdict: a right rule is checked without it, and a wrong
    rule is refused with hypothesis's search finding nothing (here: failing at once)."""
    monkeypatch.setattr(rule_check, "_hypothesis_search",
                        lambda *a: pytest.fail("hypothesis ran on a right rule"))
    assert check_rule(_user_rule()).rewritten > 0
    monkeypatch.setattr(rule_check, "_hypothesis_search", lambda *a: 1 // 0)
    with pytest.raises(LawViolation, match="-0.0"):  # the draw's own counterexample
        check_rule(_wrong_rule())


def test_the_torch_line_is_major_minor_of_a_release_and_whole_otherwise():
    assert torch_line("2.14.1+cu128") == torch_line("2.14.0") == torch_line("2.14.1+cpu") == "2.14"
    assert torch_line("2.15.0a0+git1234abc") == "2.15.0a0+git1234abc"
    assert torch_line("2.15.0.dev20260101+cpu") == "2.15.0.dev20260101+cpu"
    assert torch_line("2.13.0rc1") == "2.13.0rc1"
    assert torch_line() == versions()[1]


def test_a_def_is_keyed_by_its_source_and_a_lambda_by_its_bytecode(tmp_path, monkeypatch):
    """A ``def`` is its source text (the same on every Python release), checked against the
    code it runs: the file edited since the import no longer passes for its source."""
    path = tmp_path / "rule_src_mod.py"
    path.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import rule_src_mod

    assert rule_key._code_identity(rule_src_mod.f.__code__).startswith(b"source\0def f(x):")
    assert rule_key._code_identity((lambda x: x).__code__).startswith(b"bytecode\0")
    before = code_digest(rule_src_mod.f)
    path.write_text("def f(x):\n    return x + 2\n")  # edited after the import
    rule_key._source.cache_clear()
    assert rule_key._code_identity(rule_src_mod.f.__code__).startswith(b"bytecode\0")
    assert code_digest(rule_src_mod.f) != before


# --- a torch outside the shipped lines says so, once --------------------------------------------


def test_a_torch_outside_the_shipped_lines_says_so_once_in_one_line(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setattr(verdicts_module, "_WARNED", [])
    monkeypatch.setattr(rule_key, "torch_line", lambda version=None: "2.99")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for store in (tmp_path, False):  # two processes' worth of checks: one line
            assert isinstance(check_rules([_wrong_rule()], verdicts=store)[0], LawViolation)
    said = [w for w in seen if issubclass(w.category, NoShippedVerdicts)]
    assert len(said) == 1, [str(w.message) for w in seen]
    text = str(said[0].message)
    assert "\n" not in text and "2.13" in text and "1 rule(s)" in text and str(tmp_path) in text
    assert "s on two cores" in text


def test_a_shipped_torch_line_says_nothing(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setattr(verdicts_module, "_WARNED", [])
    if versions()[1] not in shipped_lines(versions()[0]):
        pytest.skip(f"no verdicts ship for torch {versions()[1]}")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert isinstance(check_rules([_wrong_rule()], verdicts=tmp_path)[0], LawViolation)
    assert not [w for w in seen if issubclass(w.category, NoShippedVerdicts)]


def test_a_sample_of_the_shipped_verdicts_recomputed():
    sample = [RELU_RELU, TIMES_ONE]
    found = verdicts_module.checked_verdicts(sample, workers=1)
    assert drifted(sample, [verdict_key(r) for r in sample], found) == []


@pytest.mark.nightly
def test_every_shipped_verdict_recomputed():
    rules = shipped_rules()
    found = verdicts_module.checked_verdicts(rules)
    assert drifted(rules, [verdict_key(r) for r in rules], found) == []
