"""The guard predicates written once for ``rewrite`` and ``saturate``
(``transforms.rewrite.guards``): the working graph (``OnGraph``) and the e-graph
(``eclass_view.EClassView``) answer one ``MemoryView`` question alike where both know, and
the drivers' difference on unknowns is a parameter (``same_strides``, ``same_sharing``), not a
second copy. The drivers' own tests (``test_rewrite_guards``, ``test_saturate_*``) show each
guard needed; here, the shared pieces' answers."""

from __future__ import annotations

import pytest
import torch

from ir import import_ep
from ir.args import IList, Ref
from ir.fake_memo import FakeMemo
from transforms import kernel as kn
from transforms.machinery.trace import TRAINING, trace
from transforms.rewrite import guards, result_sharing
from transforms.rewrite.eclass_view import EClassView
from transforms.rewrite.egraph import from_graph
from transforms.rewrite.rule import bind_scalars


class _Chain(torch.nn.Module):
    def forward(self, x):
        a = torch.sin(x)
        b = torch.cos(a)
        return b.t(), a + 1


class _GraphView:
    """A bare ``guards.GraphView`` of an IR graph: nodes by name and their readers."""

    def __init__(self, graph) -> None:
        self.node = {n.name: n for n in graph.nodes}
        self.users: dict[str, dict[str, None]] = {}
        for n in graph.nodes:
            for r in n.inputs():
                self.users.setdefault(r.name, {})[n.name] = None


def _views():
    p = import_ep(torch.export.export(_Chain(), (torch.randn(3, 4),)))
    graph = p.root_module.graph
    geg = from_graph(p, p.root, graph)
    names = {n.target.__name__.split(".")[0] if callable(n.target) else n.op: n.name
             for n in graph.nodes}
    return _GraphView(graph), EClassView(geg.eg, frozenset(geg.roots)), geg.class_of, names


def test_both_views_answer_reach_and_the_alias_guard_alike():
    graph_view, eclass_view, class_of, n = _views()
    x, sin, cos, t = n["placeholder"], n["sin"], n["cos"], n["t"]
    for name, escapes in ((x, True), (sin, False), (cos, True)):  # cos through its view t
        assert guards.OnGraph(graph_view).reach(name) == (escapes, False)
        assert eclass_view.reach(class_of[name]) == (escapes, False)
    assert guards.OnGraph(graph_view).sources(t) == (cos,)
    assert class_of[cos] in eclass_view.sources(class_of[t])
    for result, outside, safe in ((sin, x, True), (cos, x, False), (cos, sin, True)):
        assert guards.alias_guard(graph_view, {result: outside}) is safe
        assert guards.alias_guard(eclass_view, {class_of[result]: class_of[outside]}) is safe
    assert guards.sharing_guard(graph_view, [(cos, x)]) is False
    assert guards.sharing_guard(eclass_view, [(class_of[cos], class_of[sin])]) is True


def test_same_strides_and_its_parameters():
    a = torch.empty(2, 3)
    at = torch.empty(3, 2).t()
    assert guards.same_strides(a, a) is True and guards.same_strides(a, at) is False
    assert guards.same_strides([a, at], [a, at]) is True
    assert guards.same_strides([a, a], [a, at]) is False
    assert guards.same_strides(a, torch.empty(3, 2)) is None  # another shape: nothing to compare
    assert guards.same_strides(a, torch.empty(3, 2), unknown=True) is True
    assert guards.same_strides([a, 1.0], [a, 1.0]) is None
    assert guards.same_strides([a, 1.0], [a, 1.0], unknown=True) is True
    one, other = torch.empty_strided((1, 1), (1, 1)), torch.empty_strided((1, 1), (5, 1))
    assert guards.same_strides(one, other) is False
    assert guards.same_strides(one, other, single=True) is True


def test_same_sharing_and_unknowns():
    x = torch.randn(2, 3)
    assert guards.same_sharing(x.view(6), x, x.view(6), x) is True
    strided = x.t()
    assert guards.same_sharing(x.reshape(6), x, strided.reshape(6), strided) is False
    assert guards.same_sharing(1.0, None, 2.0, None) is False
    assert guards.same_sharing(1.0, None, 2.0, None, unknown=True) is True
    assert guards.same_sharing(x.view(6), x, 2.0, None, unknown=True) is False


def test_fake_run_takes_a_mapping_or_a_function_and_memoizes_failures():
    p = import_ep(torch.export.export(_Chain(), (torch.randn(3, 4),)))
    val = next(n.meta["val"] for n in p.root_module.graph.nodes if n.op == "placeholder")
    mm = torch.ops.aten.mm.default
    args = (Ref("a"), Ref("b"))
    fits = {"a": val, "b": val.t()}
    assert tuple(guards.fake_run(mm, args, {}, fits).shape) == (3, 3)
    assert tuple(guards.fake_run(mm, args, {}, fits.get).shape) == (3, 3)
    memo = FakeMemo()
    for _ in range(2):
        with pytest.raises(kn.FakeRunFailed):
            guards.fake_run(mm, args, {}, {"a": val, "b": val}.get, memo)
    assert memo.runs == 1


def test_bind_scalars_binds_typed_sentinels_and_renames():
    sentinels = {(float, 0.5): 1, (int, 7): 2}
    tree = (Ref("x"), 0.5, IList((7, 7.0)))
    got = bind_scalars(tree, sentinels, {1: 2.0, 2: 3}, {"x": Ref("y")})
    assert got == (Ref("y"), 2.0, IList((3, 7.0)))  # 7.0 is no int sentinel
    assert bind_scalars(tree, sentinels, {}) == tree


def test_base_pairs_are_the_results_that_are_views_of_one_value():
    x = (torch.randn(4, 3),)
    split = trace(lambda x: torch.split(x, 2), x, TRAINING, "split", "pattern")
    fresh = trace(lambda x: (x + 1, x * 2), x, TRAINING, "fresh", "pattern")
    assert result_sharing.base_pairs(split) == {(0, 1)}
    assert result_sharing.base_pairs(fresh) == frozenset()


_RELU, _AS_STRIDED = torch.ops.aten.relu.default, torch.ops.aten.as_strided.default
_FLAT, _STRIDED = torch.empty(2, 3), torch.empty(3, 2).t()  # one shape, two layouts


def _follow(users, after, *, old=None, reads=(), raising=(), flips=(), refuse=(), **how):
    """``guards.follow_layout`` from ``a`` (new value ``_STRIDED``) over a toy graph:
    ``users[v]``, the readers of ``v``; ``after[u]``, what running ``u`` again gives;
    ``reads``: readers that read strides; ``raising``: readers whose run raises; ``flips``:
    readers whose sharing with what they read flips; ``refuse``: values whose readers the
    driver refuses. Returns the walk's answer and the ``(value, restrided)`` pairs asked."""
    old = old if old is not None else {v: torch.empty(2, 3) for v in ("a", *after)}
    asked = []

    def readers(v, restrided, vals):
        asked.append((v, restrided))
        return [None] if v in refuse else [
            (u, _AS_STRIDED if u in reads else _RELU, u, v) for u in users.get(v, ())]

    def rerun(u, vals):
        if u in raising:
            raise kn.FakeRunFailed(_RELU, RuntimeError("no view of that shape"))
        return after[u]

    def sharing(before, before_in, new, new_in):
        return not any(before is old[u] for u in flips)

    found = guards.follow_layout("a", _STRIDED, readers, rerun, old.get,
                                 strides=guards.same_strides, sharing=sharing, **how)
    return found, asked


def test_follow_layout_follows_readers_while_strides_differ():
    users = {"a": ["b", "d"], "b": ["c"]}
    after = {"b": _STRIDED, "c": _FLAT, "d": _FLAT}  # b keeps the new layout; c and d do not
    found, asked = _follow(users, after)
    assert found == ({"a": _STRIDED, "b": _STRIDED}, set())
    assert asked == [("a", True), ("b", True)]  # c's and d's readers see no difference
    assert _follow(users, {**after, "c": _STRIDED}, reads={"c"})[0] is None
    assert _follow(users, after, raising={"c"})[0] is None
    assert _follow(users, after, refuse={"b"})[0] is None
    assert _follow(users, after, old={"a": _FLAT, "b": _FLAT, "d": _FLAT})[0] is None  # no c
    assert _follow(users, after, reads={"d"})[0] is None  # even one of old strides out


def test_follow_layout_stops_past_its_cap(monkeypatch):
    users = {"a": ["b", "d"], "b": ["c"]}
    after = {"b": _STRIDED, "c": _FLAT, "d": _FLAT}
    monkeypatch.setattr(guards, "LAYOUT_CAP", 3)
    assert _follow(users, after)[0] is not None  # three readers run: b, c, d
    monkeypatch.setattr(guards, "LAYOUT_CAP", 2)
    assert _follow(users, after)[0] is None


def test_follow_layout_notes_sharing_flips_and_follows_them_where_asked():
    users, after = {"a": ["b"], "b": ["c"]}, {"b": _FLAT, "c": _FLAT}
    found, asked = _follow(users, after, flips={"b"})
    assert found == ({"a": _STRIDED, "b": _FLAT}, {"b"})
    assert asked == [("a", True), ("b", False)]  # b followed for its sharing: strides alike
    found, asked = _follow(users, after, flips={"b"}, follow_flips=False)
    assert found == ({"a": _STRIDED}, {"b"}) and asked == [("a", True)]
