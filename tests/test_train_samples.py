"""Sample videos during training: skeleton | generated | ground truth MP4s from the current weights."""

import dataclasses

import imageio.v3 as iio
import numpy as np

from rynn_jax.training import config as config_lib

import train


def test_sample_videos_written_and_change_with_training(tmp_path):
    cfg = config_lib.load_config("configs/tiny.py")
    cfg = dataclasses.replace(cfg, total_steps=6, log=dataclasses.replace(
        cfg.log, dir=str(tmp_path), sample_every=3, sample_vae="tiny", sample_steps=2, progress=False))
    train.train(cfg)
    files = sorted((tmp_path / "samples").glob("sample_*.mp4"))
    assert [f.name for f in files] == ["sample_0000003.mp4", "sample_0000006.mp4"]
    a, b = (iio.imread(f) for f in files)
    t, h, w3, _ = a.shape
    assert t == 1 + 4 * (cfg.data.synthetic_shape[0] - 1) and w3 % 3 == 0
    w = w3 // 3
    # skeleton and ground-truth panels come from the same fixed batch (equal up to lossy H.264);
    # the generated one moves with the weights
    diff = lambda panel: np.abs(a[..., panel, :].astype(int) - b[..., panel, :].astype(int)).mean()  # noqa: E731
    still, moving = diff(slice(0, w)), diff(slice(w, 2 * w))
    assert moving > 2 * still and moving > 1.0, (still, moving)
