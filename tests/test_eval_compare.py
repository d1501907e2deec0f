"""`python -m rynn_jax.eval.compare`: one table for several eval.py runs, on their common episodes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rynn_jax.eval import compare

FRAMES = 5


def _write_run(d, episodes: dict[str, dict[str, float]], frames: int = FRAMES, features: bool = False, seed: int = 0):
    """An eval.py output folder: episodes/<stem>.json with constant per-frame PSNR = the given value."""
    (d / "episodes").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name, variants in episodes.items():
        rec = {"episode": name, "frames": frames, "height": 8, "width": 12, "variants": {}}
        for v, psnr in variants.items():
            rec["variants"][v] = {"per_frame": {"psnr": [100.0] + [psnr] * (frames - 1)},
                                  "video": {"psnr": psnr, "ssim": psnr / 100, "lpips": 1 / psnr}}
        stem = name.replace("/", "__")
        (d / "episodes" / f"{stem}.json").write_text(json.dumps(rec))
        if features:
            np.savez(d / "episodes" / f"{stem}.npz", model=rng.standard_normal(6), truth=rng.standard_normal(6))
    return d


def test_table_on_common_episodes(tmp_path, capsys):
    t = _write_run(tmp_path / "t", {"a/e0": {"model": 24.0, "copy_first_frame": 18.0},
                                    "a/e1": {"model": 22.0, "copy_first_frame": 19.0},
                                    "a/e2": {"model": 30.0, "copy_first_frame": 10.0}})  # e2: teacher only
    s = _write_run(tmp_path / "s", {"a/e0": {"model": 23.0, "model_swapped": 20.0, "copy_first_frame": 18.0},
                                    "a/e1": {"model": 22.5, "model_swapped": 17.0, "copy_first_frame": 19.0}})
    out = compare.main([f"teacher={t}", f"student={s}", "--out", str(tmp_path / "cmp")])
    assert out["episodes"] == ["a/e0", "a/e1"]
    rows = out["rows"]
    assert rows["teacher"]["psnr"]["mean"] == pytest.approx(23.0)
    assert rows["teacher"]["psnr"]["std"] == pytest.approx(np.std([24.0, 22.0]))
    assert rows["student, swapped control"]["psnr"]["mean"] == pytest.approx(18.5)
    assert rows["copy first frame"]["psnr"]["mean"] == pytest.approx(18.5)
    assert out["model_minus_copy_first_frame_db"]["teacher"]["mean"] == pytest.approx(np.mean([6.0, 3.0]))
    (pair,) = out["paired_psnr_db"]
    assert (pair["a"], pair["b"], pair["a_better"], pair["n"]) == ("teacher", "student", 1, 2)
    assert pair["mean"] == pytest.approx(np.mean([1.0, -0.5])) and pair["min"] == pytest.approx(-0.5)
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| teacher | 23.00 ± 1.00 |" in md and "teacher better in 1 of 2" in md
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["n"] == 2
    assert (tmp_path / "cmp" / "psnr_over_time.png").stat().st_size > 1000
    assert "teacher vs student" in capsys.readouterr().out


def test_fvd_per_row_from_stored_features(tmp_path):
    from rynn_jax.eval import fvd

    eps = {f"a/e{i}": {"model": 20.0 + i, "copy_first_frame": 18.0} for i in range(3)}
    t = _write_run(tmp_path / "t", eps, features=True, seed=1)
    s = _write_run(tmp_path / "s", eps, features=True, seed=2)
    out = compare.compare({"teacher": t, "student": s})
    z = [np.load(t / "episodes" / f"a__e{i}.npz") for i in range(3)]
    want = fvd.fvd_from_features(np.stack([x["model"] for x in z]), np.stack([x["truth"] for x in z]))
    assert out["fvd"]["per_row"]["teacher"] == pytest.approx(want)
    assert out["fvd"]["per_row"]["student"] != pytest.approx(want)  # its own features
    assert out["fvd"]["meaningful"] is False


def test_refuses_runs_that_scored_different_truth(tmp_path):
    t = _write_run(tmp_path / "t", {"a/e0": {"model": 24.0, "copy_first_frame": 18.0}})
    s = _write_run(tmp_path / "s", {"a/e0": {"model": 23.0, "copy_first_frame": 17.0}})
    with pytest.raises(ValueError, match="copy_first_frame.*differs by 1"):
        compare.compare({"teacher": t, "student": s})


@pytest.mark.parametrize("make, match", [
    (lambda p: [f"teacher={_write_run(p / 't', {'a/e0': {'model': 1.0}})}"], "at least two runs"),
    (lambda p: ["teacher", "student=x"], "expected NAME=DIR"),
    (lambda p: [f"t={p}", f"s={p}"], "no episodes/ folder"),
    (lambda p: [f"t={_write_run(p / 't', {'a/e0': {'model': 1.0}})}",
                f"s={_write_run(p / 's', {'a/e0': {'model': 1.0}}, frames=9)}"], "share no episode"),
])
def test_bad_input_one_line(tmp_path, capsys, make, match):
    with pytest.raises(SystemExit) as e:
        compare.main([*make(tmp_path), "--out", str(tmp_path / "cmp")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(match, err), err
    assert not (tmp_path / "cmp").exists()  # nothing written
