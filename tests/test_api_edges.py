"""API edges: pass names in ``transform`` (one table with ``purefx --passes``), a purefx error for
anything but a Program in ``transform``/``lower``, and a ``purefx`` run with an empty stderr even
where torch would warn at import (a broken NumPy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from zoo import CASES, eager_model, export_case

from ir import LoweringError, PassError, import_ep
from lowering import lower
from lowering.cli import known_passes
from transforms import DEFAULT_PIPELINE, transform
from transforms.pipeline import named_passes

ROOT = Path(__file__).resolve().parents[1]


def test_transform_takes_pass_names() -> None:
    p = import_ep(export_case(CASES["mlp_nested"]))
    names = [f.__name__ for f in DEFAULT_PIPELINE]
    by_name = transform(p, names)
    assert by_name == transform(p, list(DEFAULT_PIPELINE))
    assert transform(p, ["remove_effect_tokens", DEFAULT_PIPELINE[1]]) == transform(
        p, list(DEFAULT_PIPELINE[:2])
    )
    x = CASES["mlp_nested"].args()[0]
    assert torch.allclose(lower(by_name)(x), eager_model(CASES["mlp_nested"])(x))


def test_one_name_table_for_api_and_cli() -> None:
    assert known_passes() == named_passes()
    assert {"outline", "sink_state", "deduplicate", "inline"} <= set(named_passes())


def test_unknown_pass_name_lists_the_known_ones() -> None:
    p = import_ep(export_case(CASES["mlp_nested"]))
    with pytest.raises(PassError, match=r"unknown pass 'outlin'; known passes: .*outline"):
        transform(p, ["outlin"])
    with pytest.raises(PassError, match="not a int"):
        transform(p, [3])


@pytest.mark.parametrize("value", ["ep", "module", None])
def test_transform_and_lower_name_what_they_got(value: str | None) -> None:
    ep = export_case(CASES["mlp_nested"])
    given = {"ep": ep, "module": eager_model(CASES["mlp_nested"]), None: None}[value]
    expected = {"ep": "ExportedProgram", "module": "NestedMLP", None: "None"}[value]
    with pytest.raises(PassError, match=rf"got .*{expected}.*import_ep"):
        transform(given)
    with pytest.raises(LoweringError, match=rf"got .*{expected}.*import_ep"):
        lower(given)


def test_cli_stderr_is_empty_even_with_a_broken_numpy(tmp_path: Path) -> None:
    """torch warns "Failed to initialize NumPy" at import when NumPy is broken; the command
    silences that one message for its own import of torch."""
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "class ndarray: pass\n"
        "class memmap(ndarray): pass\n"
        "class generic: pass\n"
        "def __getattr__(name):\n"
        "    if name.startswith('__'):\n"
        "        raise AttributeError(name)\n"
        "    return type(name, (generic,), {})\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env=env, capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert "Failed to initialize NumPy" in probe.stderr  # the fake NumPy does break torch's
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from lowering.cli import main; sys.exit(main())"],
        env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "PASS" in run.stdout
