"""The synthetic autoencoder adapted to RynnWorld-4D's depth and flow videos (docs/RYNNWORLD4D.md),
exported to synthetic.AUTOENCODER_4D beside the RGB autoencoder, which the teacher and student keep
using. Four ways, all behind the committed RGB autoencoder's encoder (`ckpt.init_from`):

    python train.py --config configs/synthetic_ae4d.py          # whole autoencoder fine-tuned
    python train.py --config configs/synthetic_ae4d.py:frozen   # encoder frozen, its decoder fine-tuned
    python train.py --config configs/synthetic_ae4d.py:wide     # the same from the wide decoder's export
    python train.py --config configs/synthetic_ae4d.py:long     # `frozen` on 49-frame clips (revision 7)

* default: encoder and decoder trained on the head-camera and skeleton videos plus the exact depth
  and flow renders as the 4D model's grey and colour-wheel videos (`data.videos`: depth.npz /
  flow.npz, cut into the same windows), so that flow survives the latent space. The latents move
  with the encoder (the same RGB clips' normalised latents differ by ≈ 40 % in relative L2), so the
  RGB teacher that stage 1 starts from no longer speaks them.
* `frozen`: the paper's arrangement (one frozen video VAE for all three streams) plus a decoder
  that learned depth and flow: training/decoder.py's `vae` flavour on the RGB, depth and flow
  videos. Encoder and latent statistics stay bit for bit the RGB autoencoder's, so RGB latents are
  exactly the ones the teacher was trained on; how well flow survives is then up to the decoder.
* `wide`: `frozen` starting from `configs/synthetic_decoder.py:vae_wide`'s export (a decoder 64 wide
  trained on RGB alone behind the same encoder: +1.3 dB on held-out RGB, but depth and flow decode
  5 and 14 dB worse than the committed decoder's), so that one wider decoder serves all three videos.
* `long`: `frozen` on 49-frame clips (12 latents, batch 8) at the fine-tuning rate. The causal
  encoder's latents settle only after the 5th latent, which 17-frame clips never reach; a decoder
  trained on them decodes depth past frame 16 at ≈ 30 dB instead of ≈ 49 (docs/autoencoder.md).
"""

import dataclasses

from configs import synthetic, synthetic_ae, synthetic_decoder
from rynn_jax.training.autoencoder import GEOMETRY_VIDEOS, SIM_VIDEOS

VARIANTS = ("", "frozen", "wide", "long")
LONG_FRAMES = 49  # `long`: 4 × 12 + 1 frames, past where the encoder's latents settle


def get_config(variant: str = ""):
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS} (empty: the whole autoencoder), got {variant!r}")
    if variant == "long":  # 8 × 49 frames a batch (`frozen`: 16 × 17): ≈ 11 steps/s on one H100, not ≈ 19
        cfg, run = get_config("frozen"), f"{synthetic.RUNS}/autoencoder4d_long"
        return dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, num_frames=LONG_FRAMES, batch_size=8),
            optim=dataclasses.replace(cfg.optim, lr=2e-4), ckpt=dataclasses.replace(cfg.ckpt, dir=f"{run}/ckpt"),
            log=dataclasses.replace(cfg.log, dir=f"{run}/logs"), total_steps=3000)
    if variant in ("frozen", "wide"):
        cfg = synthetic_decoder.get_config("vae")
        run = f"{synthetic.RUNS}/autoencoder4d_{variant}"
        init = synthetic_decoder.get_config("vae_wide").export_dir if variant == "wide" else cfg.ckpt.init_from
        return dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, videos={"rgb": SIM_VIDEOS["rgb"], **GEOMETRY_VIDEOS},
                                          eval_clips=128),
            optim=dataclasses.replace(cfg.optim, lr=3e-4, warmup_steps=50),
            ckpt=dataclasses.replace(cfg.ckpt, dir=f"{run}/ckpt", every=500, init_from=init),
            log=dataclasses.replace(cfg.log, dir=f"{run}/logs"),
            total_steps=4000, export_dir=synthetic.AUTOENCODER_4D)
    cfg = synthetic_ae.get_config("wide")  # the committed autoencoder's widths (since revision 6: decoder 64)
    run = f"{synthetic.RUNS}/autoencoder4d"
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, videos={**SIM_VIDEOS, **GEOMETRY_VIDEOS}, eval_clips=128),
        optim=dataclasses.replace(cfg.optim, lr=3e-4, warmup_steps=50),
        ckpt=dataclasses.replace(cfg.ckpt, dir=f"{run}/ckpt", init_from=synthetic.AUTOENCODER),
        log=dataclasses.replace(cfg.log, dir=f"{run}/logs"),
        total_steps=4000, export_dir=synthetic.AUTOENCODER_4D)
