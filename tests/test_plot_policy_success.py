"""scripts/plot_policy_success.py: success rate per task against a number, from serve.py policy's table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_policy_success.py"


def _load():
    spec = importlib.util.spec_from_file_location("plot_policy_success", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(tmp_path: Path) -> Path:
    cell = lambda k, n: {"successes": k, "trials": n, "rate": round(k / n, 4)}  # noqa: E731
    table = {"a": {"t1": cell(1, 10), "t2": cell(5, 10)}, "b": {"t1": cell(7, 10), "t2": cell(10, 10)},
             "ref": {"t1": cell(9, 10), "t2": cell(10, 10)}}
    path = tmp_path / "success.json"
    path.write_text(json.dumps(table))
    return path


def test_plot_is_written(tmp_path):
    out = tmp_path / "curve.png"
    assert _load().main(["--table", str(_table(tmp_path)), "--rows", "a=20", "b=60", "--reference", "ref",
                         "--out", str(out)]) == 0
    from PIL import Image

    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200


@pytest.mark.parametrize("rows", [["missing=20"], ["a"]])
def test_bad_rows_are_refused(tmp_path, rows, capsys):
    with pytest.raises(SystemExit):
        _load().main(["--table", str(_table(tmp_path)), "--rows", *rows, "--out", str(tmp_path / "x.png")])
    assert "want ROW=X" in capsys.readouterr().err


def test_bars_merge_tables(tmp_path):
    table = _table(tmp_path)
    other = tmp_path / "scripted.json"
    other.write_text(json.dumps({"scripted": json.loads(table.read_text())["ref"]}))
    out = tmp_path / "bars.png"
    assert _load().main(["--bars", "--table", str(table), str(other), "--rows", "a=(a) 4D", "b=(b) RGB",
                         "--reference", "scripted", "--out", str(out)]) == 0
    from PIL import Image

    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200


def test_repeated_rows_across_tables_and_labels_without_bars_are_refused(tmp_path, capsys):
    table = _table(tmp_path)
    with pytest.raises(SystemExit):
        _load().main(["--table", str(table), str(table), "--rows", "a=1", "--out", str(tmp_path / "x.png")])
    assert "already read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _load().main(["--table", str(table), "--rows", "a=(a) 4D", "--out", str(tmp_path / "x.png")])
    assert "labels need --bars" in capsys.readouterr().err
