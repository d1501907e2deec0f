"""CPU / CI smoke version of configs/synthetic_decoder.py (`:tae` or `:vae`): a 22k-parameter tiny
decoder (or the autoencoder's decoder) on 5-frame 64×96 clips of the same episodes. Same paths as the
real recipe (checkpoints, export): run it in a scratch directory or override them.

    python train.py --config configs/synthetic_decoder_tiny.py:tae --set ckpt.dir=/tmp/d/ckpt --set log.dir=/tmp/d/logs --set export_dir=/tmp/d/tiny_decoder
"""

from configs import synthetic_decoder


def get_config(flavour: str = "tae"):
    return synthetic_decoder.tiny(synthetic_decoder.get_config(flavour))
