"""The two ways purefx runs a flat program agree: ``transforms.rewrite.interpret.run_program``
(how the rewrite laws, ``check_rule`` and ``check_rule_in_context``, see a program) and the
module ``lowering.lower`` makes (how ``check_laws`` sees one). On programs drawn by
``ir.strategies.programs()``, run on equal copies of the inputs and state under one seed, both
give the same outputs bit for bit (``ir.harness.same_bits``), write the same into the inputs and
into every state tensor, and return outputs that share memory with the same inputs and state.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from lawcases import examples

from ir.harness import fresh, outcome, same_bits, shares_storage, value_difference
from ir.program import Program
from ir.strategies import program_inputs, programs
from ir.torch_seam import pytree
from lowering import lower
from transforms.rewrite.interpret import program_state, run_program

SEED = 7


def _module_state(module: torch.nn.Module, fqns) -> dict[str, torch.Tensor]:
    out = {}
    for fqn in fqns:
        obj = module
        for part in fqn.split("."):
            obj = getattr(obj, part)
        out[fqn] = obj
    return out


def _interpreted(p: Program, args: tuple, kwargs: dict):
    leaves = pytree.tree_leaves((args, kwargs))
    state = program_state(p)
    ran = outcome(lambda *xs: run_program(p, xs, state), *leaves, seed=SEED)
    return ran, state


def _lowered(p: Program, args: tuple, kwargs: dict, fqns):
    module = lower(p)
    ran = outcome(module, *args, seed=SEED, **kwargs)
    return ran, _module_state(module, fqns)


def _difference(p: Program) -> str | None:
    args, kwargs = program_inputs(p)
    mine, my_state = _interpreted(p, args, kwargs)
    theirs, their_state = _lowered(p, args, kwargs, my_state)
    if mine.ok != theirs.ok:
        return f"interpreter error {mine.error}, lowered module error {theirs.error}"
    if not mine.ok:
        return None  # both raise: nothing to compare
    outs = pytree.tree_leaves(theirs.results)
    if not same_bits(tuple(mine.results), tuple(outs)):
        return "outputs: " + str(value_difference(tuple(mine.results), tuple(outs),
                                                  rtol=0.0, atol=0.0, what="outputs"))
    if not same_bits(list(mine.args), pytree.tree_leaves((theirs.args, theirs.kwargs))):
        return "inputs after the call differ"
    for fqn, value in their_state.items():
        if not same_bits(my_state[fqn], value):
            return f"state {fqn!r} after the call: " + str(
                value_difference(my_state[fqn], value, rtol=0.0, atol=0.0))
    # aliasing: an output that is an input or a state tensor is one on both sides
    mine_in = list(mine.args) + list(my_state.values())
    theirs_in = pytree.tree_leaves((theirs.args, theirs.kwargs)) + list(their_state.values())
    for k, (a, b) in enumerate(zip(mine.results, outs)):
        for j, (x, y) in enumerate(zip(mine_in, theirs_in)):
            if shares_storage(a, x) != shares_storage(b, y):
                return f"output {k} shares memory with input/state {j} on one side only"
    return None


@settings(max_examples=examples(100), deadline=None)
@given(programs())
def test_the_interpreter_computes_what_the_lowered_module_does(p):
    problem = _difference(p)
    assert problem is None, problem


def test_the_law_has_teeth(monkeypatch):
    """An interpreter that drops the writes back into the state (a ``buffer_mutation`` output)
    is told apart from the lowered module on some program."""
    from hypothesis import HealthCheck, Phase, find

    from transforms.rewrite import interpret

    real = interpret.run_program

    def forgetful(p, args, state):
        return real(p, args, dict(fresh(dict(state))))

    monkeypatch.setattr(interpret, "run_program", forgetful)
    monkeypatch.setitem(globals(), "run_program", forgetful)
    find(programs(features={"functional_mutation", "buffers", "inplace_mutation"}),
         lambda p: _difference(p) is not None,
         settings=settings(max_examples=200, database=None, derandomize=True, deadline=None,
                           phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck)))


def test_shared_state_stays_one_tensor(monkeypatch):
    """``program_state`` gives one copy per state tensor: with one copy per fqn (what
    ``check_rule_in_context`` once gave the interpreter), a write through one name of a shared
    module's buffer is not seen through the other, and the law tells the two runs apart."""
    from hypothesis import HealthCheck, Phase, find

    def per_fqn(p):
        return {fqn: fresh(p.tensors[slot.tensor].value) for fqn, slot in p.state.items()}

    monkeypatch.setitem(globals(), "program_state", per_fqn)
    find(programs(features={"shared_modules", "inplace_mutation", "functional_mutation",
                            "buffers", "nesting"}),
         lambda p: _difference(p) is not None,
         settings=settings(max_examples=500, database=None, derandomize=True, deadline=None,
                           phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
