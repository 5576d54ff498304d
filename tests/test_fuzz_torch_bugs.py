"""The fuzzer recognises the torch unflatten bugs of ``docs/findings.md`` (findings 11, 12 and 15)
in what its ``"unflatten"`` backend finds, and the ``torch.export.load`` bug (finding 17) in what
its ``"export_roundtrip"`` backend finds, and counts them as known, not as new; the repro of
an unflatten finding keeps the program's preserved calls, so it shows the finding.

Each program is imported from an eager module written as the finding's repro writes it (torch
alone), so the test also shows that the bug is reachable from eager code."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ir.import_ep import import_ep
from ir.program import Program
from lowering.fuzz import differential
from lowering.fuzz.backends import Backend
from lowering.fuzz.fuzz_programs import whole_paths
from lowering.fuzz.judge import Setup
from lowering.fuzz.repro import compile_source
from lowering.fuzz.search import Finding, _Search, with_repro
from lowering.fuzz.torch_bugs import (
    LISTED_BUGS,
    LOADED_STATE_DETACHED,
    UNFLATTEN_ARGUMENT_TWICE,
    UNFLATTEN_STATE_CHAIN,
    UNFLATTEN_UNSIGNED_VALUE,
)
from lowering.fuzz.trial import placed, try_program

_CTX: dict[str, torch.Tensor] = {}  # a value passed outside the call signature (finding 11)


class _Reads(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * _CTX["y"]


class _Unsigned(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = _Reads()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CTX["y"] = x + 1
        return self.sub(x)


class _Updates(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.b.add_(x).mul_(2)
        return x.sin()


class _Chain(torch.nn.Module):
    """Finding 12: a buffer updated twice in a preserved call, then by its caller."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _Updates()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sub(x), self.sub.b.add_(1)


class _Plain(torch.nn.Module):
    """No value or state crosses the preserved call outside its signature."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _Updates()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x) + 1


class _UpdatesOnce(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.b.sub_(x)  # its intermediate value: export names it sub_1
        return x + y


class _Twice(torch.nn.Module):
    """Finding 15: one tensor (``sub``) passed twice to a preserved call whose buffer
    intermediate (``sub_1``, the name unflatten gives the second argument) its caller reads."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _UpdatesOnce()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - 1
        y = self.sub(x, x)
        self.sub.b.add_(y)
        return y


class _UpdatesTwice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.b.mul_(2).add_(x)  # its second intermediate value: export names it add_1
        return x + y


class _TwiceAndChain(torch.nn.Module):
    """Findings 15 and 12 in one program: one tensor (``add``) passed twice to a preserved call
    that updates its buffer twice, whose second intermediate (``add_1``) its caller reads."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _UpdatesTwice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        y = self.sub(x, x)
        self.sub.b.add_(y)
        return y


_BACKEND = Backend("unflatten", "unflatten")
_SETUP = Setup()


def _program(module: torch.nn.Module, decompose: bool) -> Program:
    ep = torch.export.export(module, (torch.randn(4),), preserve_module_call_signature=("sub",))
    return placed(import_ep(ep.run_decompositions() if decompose else ep), _SETUP, True)


def _finding(program: Program, backend: Backend = _BACKEND) -> Finding | None:
    trial = try_program(program, (backend,), _SETUP)
    verdict = trial.verdicts[backend.name]
    if verdict is None:
        return None
    return Finding(backend.name, verdict.kind, verdict.detail, program, trial.args,
                   trial.kwargs, cause=verdict.cause, setup=_SETUP, compiler=backend)


def _explained_by(finding: Finding) -> list[int]:
    return [bug.finding for bug in LISTED_BUGS if bug(finding)]


def test_a_value_read_outside_the_signature_is_finding_11() -> None:
    finding = _finding(_program(_Unsigned(), decompose=False))
    assert finding is not None and finding.kind == "mismatch"
    assert _explained_by(finding) == [11]


def test_a_buffer_updated_twice_then_by_the_caller_is_finding_12() -> None:
    finding = _finding(_program(_Chain(), decompose=True))
    assert finding is not None and finding.kind == "mismatch"
    assert _explained_by(finding) == [12]


def test_one_tensor_passed_twice_with_a_buffer_intermediate_read_by_the_caller_is_finding_15(
) -> None:
    finding = _finding(_program(_Twice(), decompose=True))
    assert finding is not None and finding.kind == "crash"
    assert "copy_" in finding.detail and "list" in finding.detail
    assert _explained_by(finding) == [15]


def test_finding_15_needs_its_motif_and_its_rewrite_takes_it_away() -> None:
    """Without ``run_decompositions`` the buffer's update stays in place (no intermediate
    crosses): unflatten is right, and finding 15's rewrite has nothing to do."""
    program = _program(_Twice(), decompose=False)
    assert _finding(program) is None
    assert UNFLATTEN_ARGUMENT_TWICE.avoid(program) is program
    decomposed = _program(_Twice(), decompose=True)
    avoided = UNFLATTEN_ARGUMENT_TWICE.avoid(decomposed)
    names = [[a.name for a in sig.inputs] for sig in (decomposed.call_signatures["sub"],
                                                       avoided.call_signatures["sub"])]
    assert names[0] == ["sub", "sub"] and names[1][0] == "sub" and names[1][1] != "sub"
    assert _finding(avoided) is None


def test_a_second_bug_beside_finding_15_stays_a_finding() -> None:
    """Finding 12 in the same program: finding 15's rewrite takes away the crash, and
    unflatten still differs there, so no listed bug explains it alone."""
    finding = _finding(_program(_TwiceAndChain(), decompose=True))
    assert finding is not None and finding.kind == "crash"
    assert _explained_by(finding) == []


def test_a_program_with_nothing_crossing_is_neither() -> None:
    program = _program(_Plain(), decompose=True)
    assert _finding(program) is None  # unflatten is right on it
    # a made-up finding on it: the backend agrees with eager there, so no listed bug explains it
    fake = Finding("unflatten", "mismatch", "made up", program, (torch.randn(4),),
                   cause="aten.add.Tensor", setup=_SETUP, compiler=_BACKEND)
    assert _explained_by(fake) == []


def test_the_listed_bugs_are_asked_of_the_unflatten_target_only() -> None:
    finding = _finding(_program(_Unsigned(), decompose=False))
    assert finding is not None
    other = Finding("mine", finding.kind, finding.detail, finding.program, finding.args,
                    cause=finding.cause, setup=_SETUP,
                    compiler=Backend("mine", "callable", lambda m: m))
    assert not UNFLATTEN_UNSIGNED_VALUE(other)
    assert not UNFLATTEN_STATE_CHAIN(other)
    twice = _finding(_program(_Twice(), decompose=True))
    assert twice is not None
    assert not UNFLATTEN_ARGUMENT_TWICE(Finding(
        "mine", twice.kind, twice.detail, twice.program, twice.args, cause=twice.cause,
        setup=_SETUP, compiler=Backend("mine", "callable", lambda m: m)))
    assert not LOADED_STATE_DETACHED(other)


def test_differential_counts_them_as_known_not_new() -> None:
    programs = st.sampled_from([_program(_Unsigned(), decompose=False),
                                _program(_Chain(), decompose=True),
                                _program(_Twice(), decompose=True)])
    report = differential({"unflatten": "unflatten"}, programs=programs, max_examples=9,
                          shrink_seconds=2)
    assert report.findings == ()
    assert report.raw >= 3
    assert {name.split(":")[0] for name in report.known} == {"torch.unflatten#11",
                                                             "torch.unflatten#12",
                                                             "torch.unflatten#15"}


def test_the_repro_of_an_unflatten_finding_keeps_the_preserved_calls_and_shows_it() -> None:
    """Run from its text, torch alone, the nested repro shows what the fuzzer found: the
    submodule is a module of its own, called with its signature, and exported with
    ``preserve_module_call_signature``."""
    for module, decompose in ((_Unsigned(), False), (_Chain(), True)):
        finding = _finding(_program(module, decompose))
        assert finding is not None
        shown = with_repro(finding)
        assert shown.reproduced is True, shown.repro
        assert "preserve_module_call_signature=PRESERVED" in shown.repro
        assert "PRESERVED = ('sub',)" in shown.repro
        assert "self.sub = Mod('sub')" in shown.repro
        namespace: dict = {"__name__": "repro"}
        exec(compile_source(shown.repro), namespace)  # noqa: S102 - the script just written
        assert namespace["difference"]()  # the script's own run shows the difference


def test_a_partly_preserved_module_is_not_drawn() -> None:
    """torch's export preserves every call of a module or none: a program with ``m0``
    preserved and ``m0@1`` not is not one it gives, so the fuzzer does not draw it."""
    program = _program(_Unsigned(), decompose=False)
    assert whole_paths(program)
    twice = program.replace(call_order=(*program.call_order, "sub@1"))
    assert not whole_paths(twice)


def test_a_shrink_candidate_with_a_partly_preserved_module_is_not_kept() -> None:
    """Shrinking (``lowering.fuzz.reduce`` works on programs, not on the strategy) keeps no
    candidate that torch's export could not give, even where unflatten differs on it."""
    finding = _finding(_program(_Unsigned(), decompose=False))
    assert finding is not None
    search = _Search((_BACKEND,), st.nothing(), _SETUP, (), None)
    assert search.gives(finding, finding.program, frozenset()) is not None
    twice = finding.program.replace(call_order=(*finding.program.call_order, "sub@1"))
    assert search.gives(finding, twice, frozenset()) is None


class _DetachesState(torch.nn.Module):
    """Finding 17: ``detach_`` of a buffer, or of a tensor constant, which ``torch.export.load``
    gives back as a view; ``detach_`` of a value the program computes is no case of it."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.register_buffer("b", torch.ones(4))
        self.c = torch.full((4,), 2.0)  # a tensor constant
        self.what = what

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.what == "buffer":
            return x + self.b.detach_()
        if self.what == "constant":
            return x * self.c.detach_()
        return (x + self.b).detach_() + self.c


_ROUNDTRIP = Backend("export_roundtrip", "export_roundtrip")


def _flat(module: torch.nn.Module) -> Program:
    return placed(import_ep(torch.export.export(module, (torch.randn(4),))), _SETUP, True)


def test_detach_of_a_buffer_or_constant_after_the_round_trip_is_finding_17() -> None:
    for what in ("buffer", "constant"):
        finding = _finding(_flat(_DetachesState(what)), _ROUNDTRIP)
        assert finding is not None and finding.kind == "crash", what
        assert "Can't detach views in-place" in finding.detail, what
        assert _explained_by(finding) == [17], what


def test_detach_of_a_computed_value_is_kept_and_not_finding_17() -> None:
    program = _flat(_DetachesState("computed"))
    assert _finding(program, _ROUNDTRIP) is None  # the round trip is right on it
    fake = Finding("export_roundtrip", "crash", "made up", program, (torch.randn(4),),
                   cause="aten.detach_.default", setup=_SETUP, compiler=_ROUNDTRIP)
    assert _explained_by(fake) == []  # nothing to rewrite: the avoid gives the program itself


def test_differential_counts_finding_17_as_known_not_new() -> None:
    programs = st.sampled_from([_flat(_DetachesState("buffer"))])
    report = differential({"export_roundtrip": "export_roundtrip"}, programs=programs,
                          max_examples=2, shrink_seconds=2)
    assert report.findings == ()
    assert report.raw >= 1
    assert {name.split(":")[0] for name in report.known} == {"torch.export.load#17"}
