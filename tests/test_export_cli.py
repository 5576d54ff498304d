"""``purefx MODEL.pt2 --passes ... --out NEW.pt2``: the rewritten program, saved as a program."""

from __future__ import annotations

import copy

import pytest
import torch

from lowering import cli
from lowering.example_model import example_program


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("export_cli")
    ep = example_program()
    pt2 = where / "model.pt2"
    torch.export.save(ep, pt2)
    return ep, pt2, where


def test_out_writes_the_rewritten_program(saved, capsys) -> None:
    ep, pt2, where = saved
    new = where / "new.pt2"
    status = cli.main([str(pt2), "--passes", "remove_effect_tokens,outline,sink_state", "--out",
                       str(new)])
    assert status == 0, capsys.readouterr().err
    written = torch.export.load(new)
    args, kwargs = copy.deepcopy(ep.example_inputs)
    want = copy.deepcopy(ep).module()(*args, **kwargs)
    torch.testing.assert_close(written.module()(*args, **kwargs), want)
    assert [e.fqn for e in written.module_call_graph] == [e.fqn for e in ep.module_call_graph]
    assert written.example_inputs is not None
    assert set(written.state_dict) == set(ep.state_dict)


def test_out_to_an_unwritable_path_is_a_clear_error(saved, capsys) -> None:
    _, pt2, where = saved
    status = cli.main([str(pt2), "--out", str(where / "no" / "such" / "dir" / "new.pt2")])
    err = capsys.readouterr().err
    assert status == 2
    assert "cannot write the program" in err and "new.pt2" in err
