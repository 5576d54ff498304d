"""``load_program`` and ``purefx FILE.pt2``: crafted archives never run code without ``trust``.

Each crafted archive is a real saved program with one member changed; its payload creates a
marker file when it runs. Without ``trust`` the file is refused with one line naming the member
and the marker never appears; with ``trust`` the payload runs (so the test has teeth).
"""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from ir import LoadError, PurefxError, UntrustedProgramError, load_program
from ir.load import Limits
from lowering import cli


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.scale = torch.full((3,), 2.0)  # a constant tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A plain saved program: parameters, a constant tensor and sample inputs."""
    torch.manual_seed(0)
    ep = torch.export.export(_Small(), (torch.randn(2, 3),))
    path = tmp_path_factory.mktemp("load") / "small.pt2"
    torch.export.save(ep, path)
    return path


@pytest.fixture
def payload(tmp_path, monkeypatch):
    """``(plant, marker)``: ``plant(marker, value)`` creates ``marker`` and returns ``value``; it
    lives in a module of its own so that a pickle can name it."""
    (tmp_path / "purefx_payload.py").write_text(textwrap.dedent("""
        def plant(marker, value=None):
            open(marker, "w").write("ran")
            return value
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import purefx_payload

    yield purefx_payload.plant, tmp_path / "marker"
    sys.modules.pop("purefx_payload", None)


class _Planted:
    """Pickles as a call of ``plant(marker, value)``."""

    def __init__(self, plant, marker: Path, value=None) -> None:
        self.args = (plant, (str(marker), value))

    def __reduce__(self):
        return self.args


def _pickled(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _craft(src: Path, dst: Path, change) -> Path:
    """Copy the archive ``src`` to ``dst``; ``change(members)`` edits the dict name -> bytes."""
    with zipfile.ZipFile(src) as z:
        members = {name: z.read(name) for name in z.namelist()}
    change(members)
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return dst


def _member(members: dict, suffix: str) -> str:
    return next(n for n in members if n.endswith(suffix))


def _edit_json(members: dict, suffix: str, edit) -> None:
    name = _member(members, suffix)
    tree = json.loads(members[name])
    edit(tree)
    members[name] = json.dumps(tree).encode()


# --- crafted archives ------------------------------------------------------------------------------


def _pickled_weight(plant, marker):
    def change(members):
        def edit(config):
            entry = config["config"]["linear.weight"]
            entry["use_pickle"] = True
            members[_member(members, "data/weights/" + entry["path_name"])] = _pickled(
                _Planted(plant, marker, torch.nn.Parameter(torch.ones(3, 3)))
            )

        _edit_json(members, "_weights_config.json", edit)

    return change, "data/weights/weight_0"


def _pickled_constant(plant, marker):
    def change(members):
        def edit(config):
            entry = next(iter(config["config"].values()))
            entry["use_pickle"] = True
            members[_member(members, "data/constants/" + entry["path_name"])] = _pickled(
                _Planted(plant, marker, torch.full((3,), 2.0))
            )

        _edit_json(members, "_constants_config.json", edit)

    return change, "data/constants/tensor_0"


def _opaque_object(plant, marker):
    def change(members):
        import pickle

        root = _member(members, "archive_version").rsplit("/", 1)[0]
        data = pickle.dumps(_Planted(plant, marker))  # pickle.loads ignores what follows STOP
        members[f"{root}/data/constants/opaque_obj_0"] = data + bytes(-len(data) % 4)

        def edit(config):  # use_pickle False: torch unpickles by the name's prefix anyway
            meta = next(iter(config["config"].values()))["tensor_meta"]
            config["config"]["planted"] = {
                "path_name": "opaque_obj_0", "is_param": False, "use_pickle": False,
                "tensor_meta": meta,
            }

        _edit_json(members, "_constants_config.json", edit)

    return change, "data/constants/opaque_obj_0"


def _legacy_weights(plant, marker):
    def change(members):
        root = _member(members, "archive_version").rsplit("/", 1)[0]
        members[f"{root}/data/weights/model.pt"] = _pickled(_Planted(plant, marker, {}))

    return change, "data/weights/model.pt"


def _sample_inputs(plant, marker):
    def change(members):
        name = _member(members, "data/sample_inputs/model.pt")
        members[name] = _pickled(_Planted(plant, marker, ((torch.randn(2, 3),), {})))

    return change, "data/sample_inputs/model.pt"


def _shape_expression(plant, marker):
    def change(members):
        def edit(model):
            for value in model["graph_module"]["graph"]["tensor_values"].values():
                value["sizes"][0] = {"as_expr": {
                    "expr_str": f"__import__('pathlib').Path({str(marker)!r}).touch()",
                    "hint": {"as_int": 2},
                }}
                return

        _edit_json(members, "models/model.json", edit)

    return change, "models/model.json"


CRAFTED = {
    "pickled weight": _pickled_weight,
    "pickled constant": _pickled_constant,
    "opaque object": _opaque_object,
    "legacy .pt weights": _legacy_weights,
    "sample inputs needing full unpickling": _sample_inputs,
    "shape expression that sympify evaluates": _shape_expression,
}


@pytest.mark.parametrize("what", list(CRAFTED))
def test_crafted_archive_is_refused_and_runs_nothing(saved, tmp_path, payload, what):
    plant, marker = payload
    change, member = CRAFTED[what](plant, marker)
    bad = _craft(saved, tmp_path / "bad.pt2", change)
    with pytest.raises(UntrustedProgramError) as refused:
        load_program(bad)
    message = str(refused.value)
    assert "\n" not in message and member in message and "trust=True" in message, message
    assert not marker.exists()
    try:  # opting in runs the payload: the refusal is what stood in its way
        load_program(bad, trust=True)
    except LoadError:
        pass
    assert marker.exists(), what


def test_a_node_target_that_is_not_an_operator_is_refused(saved, tmp_path):
    def change(members):
        def edit(model):
            model["graph_module"]["graph"]["nodes"][0]["target"] = "torch.serialization.os.system"

        _edit_json(members, "models/model.json", edit)

    bad = _craft(saved, tmp_path / "bad.pt2", change)
    with pytest.raises(UntrustedProgramError, match="torch.serialization.os.system"):
        load_program(bad)
    for target in ["torch.ops.aten.__class__", "torch.ops.load_library", "_operator.call"]:
        _edit = _craft(saved, tmp_path / "bad2.pt2", lambda m, t=target: _edit_json(
            m, "models/model.json",
            lambda model: model["graph_module"]["graph"]["nodes"][0].update(target=t),
        ))
        with pytest.raises(UntrustedProgramError, match="not an operator"):
            load_program(_edit)


def test_compiled_code_is_refused(saved, tmp_path):
    def change(members):
        root = _member(members, "archive_version").rsplit("/", 1)[0]
        members[f"{root}/data/aotinductor/model/model.so"] = b"\x7fELF"

    bad = _craft(saved, tmp_path / "bad.pt2", change)
    with pytest.raises(UntrustedProgramError, match="aotinductor"):
        load_program(bad)


def test_a_plain_program_loads_and_matches(saved):
    ep = load_program(saved)
    x = torch.randn(2, 3)
    torch.testing.assert_close(ep.module()(x), torch.export.load(saved).module()(x))
    assert ep.example_inputs is not None


# --- limits and file kinds --------------------------------------------------------------------------


def test_zip_bomb_is_refused_before_it_expands(tmp_path):
    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb/archive_version", "0")
        z.writestr("bomb/data/weights/weight_0", bytes(64 * 2**20))
    assert bomb.stat().st_size < 2**20
    with pytest.raises(LoadError, match="expands .* times"):
        load_program(bomb)
    with pytest.raises(LoadError, match="over the limit"):
        load_program(bomb, limits=Limits(max_ratio=1e9, max_bytes=2**25))


def test_a_bomb_nested_in_the_sample_inputs_is_refused(saved, tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"")
        z.writestr("archive/data/0", bytes(64 * 2**20))

    def change(members):
        members[_member(members, "data/sample_inputs/model.pt")] = inner.getvalue()

    bad = _craft(saved, tmp_path / "bad.pt2", change)
    with pytest.raises(LoadError, match="sample_inputs.*expands"):
        load_program(bad)


def test_too_many_members_are_refused(saved, tmp_path):
    with pytest.raises(LoadError, match=r"members, over the limit of 5 .*max_members"):
        load_program(saved, limits=Limits(max_members=5))
    many = tmp_path / "many.pt2"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(2000):
            z.writestr(f"many/extra/{i}", b"")
    with pytest.raises(LoadError, match="2000 members"):
        load_program(many, limits=Limits(max_members=1000))


def test_a_file_over_the_byte_limit_is_refused(saved):
    with pytest.raises(LoadError, match="bytes, over the limit"):
        load_program(saved, limits=Limits(max_bytes=100))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    found: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catch(found, fifo), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "load_program blocked on a FIFO"
    assert isinstance(found[0], LoadError) and "not a regular file" in str(found[0])


def _catch(found: list, path: Path) -> None:
    try:
        load_program(path)
    except BaseException as err:  # noqa: BLE001 - the test inspects it
        found.append(err)


@pytest.mark.parametrize("kind", ["missing", "directory", "not a zip"])
def test_other_bad_paths_give_a_load_error(tmp_path, kind):
    path = {"missing": tmp_path / "nope.pt2", "directory": tmp_path}.get(kind)
    if path is None:
        path = tmp_path / "junk.pt2"
        path.write_bytes(b"junk" * 100)
    with pytest.raises(LoadError) as err:
        load_program(path)
    assert str(err.value).startswith(str(path)) and isinstance(err.value, PurefxError)


# --- the command ---------------------------------------------------------------------------------


def test_cli_refuses_in_one_line_and_trust_opts_in(saved, tmp_path, payload, capfd):
    plant, marker = payload
    change, member = _pickled_weight(plant, marker)
    bad = _craft(saved, tmp_path / "bad.pt2", change)
    assert cli.main([str(bad), "--progress", "off"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"purefx: error: {bad}: member") and member in err and "--trust" in err
    assert not marker.exists()
    assert cli.main([str(bad), "--trust", "--progress", "off"]) == 0
    assert "PASS" in capfd.readouterr().out and marker.exists()


def test_cli_limit_flags(saved, capfd):
    assert cli.main([str(saved), "--max-members", "3", "--progress", "off"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "over the limit of 3" in err and "--max-members" in err
    assert cli.main([str(saved), "--max-members", "100", "--progress", "off"]) == 0


def test_cli_malformed_program_from_a_json_only_file_gives_one_line(saved, tmp_path, capfd):
    """A call graph entry naming a parameter (only JSON edited): refused at import, no traceback."""
    def change(members):
        _edit_json(members, "models/model.json", lambda model: model["graph_module"][
            "module_call_graph"].append({"fqn": "linear.weight", "signature": None}))

    bad = _craft(saved, tmp_path / "bad.pt2", change)
    assert cli.main([str(bad), "--progress", "off"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "'linear.weight'" in err and "not a module" in err
