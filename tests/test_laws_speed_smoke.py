"""``bench.laws_speed`` runs and splits its time (no timing is asserted)."""

from __future__ import annotations

from bench import laws_speed


def test_one_cell_is_measured_and_split(capsys):
    assert laws_speed.main(["--examples", "3", "--clock", "cpu",
                            "--only", r"^fold_constants on programs\(\)$"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| fold_constants on programs()")]
    assert len(rows) == 1
    cells = rows[0].strip("|").split("|")
    assert len(cells) == 10 and float(cells[1]) > 0  # programs/s, wall, draw, 4 laws, other, engine


def test_the_split_wraps_the_laws_and_puts_them_back():
    import lowering.pass_laws as laws
    from ir.strategies import programs

    before = {name: getattr(laws, name) for name in laws_speed.LAW_FUNCTIONS}
    row = laws_speed.measure(laws_speed.fold_constants_pass, programs(), 2)
    assert {name: getattr(laws, name) for name in laws_speed.LAW_FUNCTIONS} == before
    assert row["tried"] == 2 and row["draw"] > 0 and row["check_verify"] >= 0
    assert row["check_program"] >= row.get("check_semantics", 0.0) > 0


def test_rounds_take_each_figure_s_median():
    runs = [{"c": {"wall": w, "tried": t}} for w, t in ((3.0, 10.0), (1.0, 30.0), (2.0, 20.0))]
    assert laws_speed.median_cells(runs) == {"c": {"wall": 2.0, "tried": 20.0}}
    assert laws_speed.median_cells(runs[:2] + [{}]) == {"c": {"wall": 2.0, "tried": 20.0}}
