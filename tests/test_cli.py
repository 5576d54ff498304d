"""The ``purefx`` command: end to end in a subprocess, bad files, and the HTML page in a browser."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lowering import cli
from lowering.example_model import example_program

ROOT = Path(__file__).resolve().parents[1]
MODULE_NAMES = ["embed", "blocks", "shared", "head", "linear", "norm"]


def _purefx(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the command as a user would (``python -m lowering.cli`` is what ``purefx`` runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "lowering.cli", *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """Save the example program as a .pt2, run the command on it with ``--html``, once."""
    where = tmp_path_factory.mktemp("cli")
    pt2 = where / "model.pt2"
    torch.export.save(example_program(), pt2)
    html = where / "report.html"
    done = _purefx(str(pt2), "--html", str(html))
    return done, pt2, html


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^purefx = "lowering\.cli:main"$', text, re.MULTILINE)


def test_end_to_end_on_a_saved_program(saved_run):
    done, pt2, html = saved_run
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert str(pt2) in out
    for stage in ["import_ep", "outline", "sink_state", "deduplicate", "lower"]:
        assert re.search(rf"^  {stage} +\d+\.\d\d", out, re.MULTILINE), stage
    assert re.search(r"^  +outline +[\d.]+ +\d+ +\d+$", out, re.MULTILINE)  # time, nodes, modules
    assert "shared: Block (same object as blocks.0)" in out
    assert "2 calls share 1 graph" in out  # deduplicated calls are shown
    assert re.search(r"check against ep\.module\(\): PASS \(largest abs error [\d.e+-]+\)", out)
    assert done.stderr == ""  # not a terminal: no progress bar
    assert html.exists()


def test_a_corrupt_file_gives_one_line_and_status_2(tmp_path):
    bad = tmp_path / "corrupt.pt2"
    bad.write_bytes(b"PK\x03\x04 this is not a zip archive, nor a program" * 50)
    done = _purefx(str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"purefx: error: {bad}: not a program saved with torch.export.save")


def _not_programs(tmp_path: Path) -> dict[str, Path]:
    truncated = tmp_path / "truncated.pt2"
    torch.export.save(example_program(), truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    tensor = tmp_path / "tensor.pt2"
    torch.save(torch.ones(3), tensor)
    empty = tmp_path / "empty.pt2"
    empty.write_bytes(b"")
    return {
        "missing": tmp_path / "missing.pt2",
        "directory": tmp_path,
        "truncated": truncated,
        "torch.save of a tensor": tensor,
        "empty": empty,
    }


def test_files_that_are_not_programs_give_one_line(tmp_path, capfd):
    for what, path in _not_programs(tmp_path).items():
        status = cli.main([str(path)])
        out, err = capfd.readouterr()
        assert status == 2, what
        assert out == "", what
        assert len(err.splitlines()) == 1 and err.startswith(f"purefx: error: {path}"), (what, err)
        assert "Traceback" not in err


def test_help_and_readme_say_how_programs_are_loaded(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "scanned and refused if loading it would run code from it, unless --trust" in text
    assert "torch.export.load unpickles them: only for files you trust" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "## Security and failure behaviour" in (ROOT / "README.md").read_text()
    assert "torch.export.load" in readme and "--trust" in readme


def test_no_argument_runs_the_example_model(capsys):
    assert cli.main(["--progress", "off"]) == 0
    out = capsys.readouterr().out
    assert "built-in example model" in out and "PASS" in out


def test_passes_picks_the_passes(capsys):
    assert cli.main(["--passes", "fix_module_stacks, outline"]) == 0
    out = capsys.readouterr().out
    stages = re.findall(r"^  (\w+) +\d+\.\d\d", out, re.MULTILINE)
    assert stages == ["import_ep", "fix_module_stacks", "outline", "lower"]


def test_unknown_pass_gives_one_line(capsys):
    assert cli.main(["--passes", "outline,nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown pass 'nonsense'" in err and "outline" in err


def test_a_failing_check_exits_1(monkeypatch, capsys):
    class Off(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            out = self.inner(*args, **kwargs)
            return {k: v + 0.5 if k == "hidden" else v for k, v in out.items()}

    real = cli.lower
    monkeypatch.setattr(cli, "lower", lambda p: Off(real(p)))
    assert cli.main([]) == 1
    out = capsys.readouterr().out
    assert re.search(r"FAIL \(largest abs error 0\.5\)", out)


def test_a_lowered_module_that_raises_fails_the_check():
    class Broken(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError("broken\non two lines")

    passed, verdict = cli.check(example_program(), Broken())
    assert passed is False
    assert verdict == "FAIL (the lowered module raised RuntimeError: broken on two lines)"


def test_progress_bar_only_on_a_terminal_for_large_programs(monkeypatch):
    ep = example_program()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert cli._Progress.for_run(ep, "auto", io.StringIO()).stream is None
    assert cli._Progress.for_run(ep, "auto", Terminal()).stream is None  # small program
    monkeypatch.setattr(cli, "LARGE", 10)
    assert cli._Progress.for_run(ep, "auto", io.StringIO()).stream is None
    terminal = Terminal()
    progress = cli._Progress.for_run(ep, "auto", terminal)
    assert progress.stream is terminal
    cli.run(ep, progress=progress)
    drawn = terminal.getvalue()
    stages = len(cli.DEFAULT_PIPELINE) + 2  # import_ep, the passes, lower
    assert "[" + "-" * cli._Progress.WIDTH + f"] 0/{stages} import_ep" in drawn
    assert f"{stages - 1}/{stages} lower" in drawn
    assert drawn.endswith("\r\x1b[2K")  # the line is cleared at the end


# --- the HTML page -------------------------------------------------------------------------------


def test_html_report_is_self_contained(saved_run):
    text = saved_run[2].read_text()
    assert text.startswith("<!DOCTYPE html>")
    for external in ["<script", "<link", "src=", "@import", "url(", "http://", "https://"]:
        assert external not in text, external
    assert "What each pass changed" in text and 'class="diff"' in text


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run(
        [binary, *flags, *args], check=False, capture_output=True, text=True, timeout=180
    )


@pytest.mark.skipif(_chromium() is None, reason="no chromium installed (.ci/run installs it)")
def test_html_report_renders_in_a_headless_browser(saved_run, tmp_path):
    binary = _chromium()
    url = saved_run[2].resolve().as_uri()
    dom = _browser(binary, tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = dom.stdout
    assert "purefx report" in rendered and "PASS" in rendered
    tree = rendered[rendered.index('id="tree"') : rendered.index('id="graphs"')]
    for name in MODULE_NAMES:
        assert re.search(rf">{name}</(a|span)>", tree), name
    assert "same object as blocks.0" in tree
    shot = tmp_path / "report.png"
    done = _browser(
        binary, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,2000", url
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") == 1200  # width from the IHDR chunk
    assert len(data) > 30_000  # a blank page compresses to a few kB
