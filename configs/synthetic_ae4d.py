"""The synthetic autoencoder fine-tuned for RynnWorld-4D: the committed RGB autoencoder
(`ckpt.init_from`) trained on the head-camera and skeleton videos plus the exact depth and flow
renders as the 4D model's grey and colour-wheel videos (`data.videos`: depth.npz / flow.npz, cut
into the same windows; docs/RYNNWORLD4D.md), so that flow survives the latent space. Exported
beside the RGB autoencoder, which the teacher and student keep using.

    python train.py --config configs/synthetic_ae4d.py [--set data.worker_count=14]
"""

import dataclasses

from configs import synthetic, synthetic_ae
from rynn_jax.training.autoencoder import GEOMETRY_VIDEOS, SIM_VIDEOS


def get_config():
    cfg = synthetic_ae.get_config()
    run = f"{synthetic.RUNS}/autoencoder4d"
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, videos={**SIM_VIDEOS, **GEOMETRY_VIDEOS}, eval_clips=128),
        optim=dataclasses.replace(cfg.optim, lr=3e-4, warmup_steps=50),
        ckpt=dataclasses.replace(cfg.ckpt, dir=f"{run}/ckpt", init_from=synthetic.AUTOENCODER),
        log=dataclasses.replace(cfg.log, dir=f"{run}/logs"),
        total_steps=4000, export_dir=synthetic.AUTOENCODER_4D)
