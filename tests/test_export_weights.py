"""A trained run exported to a converted-weights directory loads as the same model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import train
from rynn_jax.models.dit_weights import load_dit
from rynn_jax.training import config as config_lib
from rynn_jax.training.export_weights import export_weights


def test_export_then_load_dit_matches(tmp_path):
    cfg = config_lib.load_config("configs/tiny.py")
    cfg = dataclasses.replace(cfg, total_steps=4,
                              ckpt=dataclasses.replace(cfg.ckpt, dir=str(tmp_path / "run"), every=2),
                              log=dataclasses.replace(cfg.log, progress=False))
    train.train(cfg)
    assert export_weights(cfg, str(tmp_path / "w"), use_ema=False) == 4
    raw = load_dit(str(tmp_path / "w"))
    assert export_weights(cfg, str(tmp_path / "w_ema")) == 4
    ema = load_dit(str(tmp_path / "w_ema"))
    m = cfg.model
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.standard_normal((1, 3, 4, 4, m.in_channels)), jnp.float32)
    c = jnp.asarray(rng.standard_normal((1, 3, 4, 4, m.control_channels)), jnp.float32)
    t = jnp.array([[0.0, 500.0, 500.0]])
    ctx = jnp.zeros((1, m.text_len, m.text_dim))
    out_raw, out_ema = raw(z, t, ctx, c), ema(z, t, ctx, c)
    assert np.isfinite(np.asarray(out_raw)).all()
    assert float(jnp.abs(out_raw - out_ema).max()) > 0  # EMA (decay 0.99) lags the raw weights
    # The running control statistics travel beside the weights (control_stats.json), as trained.
    assert (tmp_path / "w" / "control_stats.json").is_file()
    stats = nnx.to_pure_dict(nnx.state(raw, nnx.Not(nnx.Param)))["control"]
    trained = 4 * cfg.grad_accum  # one update per (micro-)batch
    for rs in (stats["control_stats"], stats["video_stats"]):
        assert int(rs["count"]) == trained and float(np.abs(np.asarray(rs["mean"])).max()) > 0
    assert jax.tree.structure(nnx.to_pure_dict(nnx.state(raw, nnx.Param))) == \
        jax.tree.structure(nnx.to_pure_dict(nnx.state(ema, nnx.Param)))
