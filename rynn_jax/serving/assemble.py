"""Assembly of the served modules from weights: which networks a command runs (`choose_weights`:
--dit/--vae, the bundled student, or tiny random ones), the DiT and VAE built from them
(`build_modules`, optionally FP8), and the world model around them — the causal student's
`StreamingSession` in the layout it was distilled for (`serving_session`), or the bidirectional
teacher (`build_world_model`), or RynnWorld-4D's three-branch model (`build_world4d`).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from rynn_jax import errors
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiT, WanDiTConfig, init_dit
from rynn_jax.models.dit_weights import load_dit
from rynn_jax.models.fp8 import load_scales, quantize_dit, with_static_scales
from rynn_jax.models.tae_weights import load_tae
from rynn_jax.models.vae import WanVAE, WanVAEConfig, init_vae
from rynn_jax.models.vae_weights import load_vae
from rynn_jax.serving import student as student_lib
from rynn_jax.serving.bidirectional import WorldModel
from rynn_jax.serving.block_step import SERVING_STEPS
from rynn_jax.serving.session import StreamingSession
from rynn_jax.serving.world4d import World4DModel

PIXEL_MULTIPLE = 32  # height and width: the VAE's 16× spatial downsampling × the DiT's 2×2 patches
TINY_SIM_RESOLUTION = (96, 160)  # --world sim / generate / live with the tiny random networks


@dataclasses.dataclass(frozen=True)
class Weights:
    """Which networks a command runs: directories (None, None: the tiny random ones)."""
    dit: str | None
    vae: str | None
    spec: student_lib.StudentSpec | None  # a student's serving layout (None: the demo's tiny rolling one)
    label: str  # for summaries
    # The repository's synthetic-world weights: trained with each task's hashed prompt
    # (`rynn_jax.text.hashed_embedding`), which the commands then give them by default.
    bundled: bool = False

    def with_student_steps(self, num_steps: int | None) -> Weights:
        """A student streamed with `num_steps` denoising passes per block instead of its own (the
        x0-Euler schedule recomputed at its shift): the bundled 4-step student keeps its held-out
        PSNR at 3 and 2 and streams faster (docs/PERFORMANCE.md). Other weights, or None: unchanged."""
        if num_steps is None or self.spec is None:
            return self
        if num_steps < 1:
            raise errors.UsageError(f"--steps must be ≥ 1, got {num_steps}")
        steps = dataclasses.replace(self.spec.steps, num_steps=num_steps)
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, steps=steps))

    def resolution(self, fallback: tuple[int, int]) -> tuple[int, int]:
        """The size the weights were trained at (a student's spec says), else `fallback`."""
        return tuple(self.spec.resolution) if self.spec and self.spec.resolution else fallback


def choose_weights(dit: str | None, vae: str | None, random_weights: bool = False) -> Weights:
    """--dit/--vae when given; else the bundled student + autoencoder when present (one line on
    stderr when not); `random_weights`: the tiny random networks, bundled weights or not."""
    if random_weights:
        if dit is not None or vae is not None:
            raise errors.UsageError("--random-weights: not with --dit / --vae")
        return Weights(None, None, None, "tiny random (--random-weights)")
    if dit is None and vae is None:
        bundled = student_lib.find_bundled()
        if bundled is None:
            print(student_lib.absent_message(), file=sys.stderr)
            return Weights(None, None, None, "tiny random (no bundled weights)")
        return Weights(bundled.student, bundled.autoencoder, bundled.spec, "bundled student", bundled=True)
    spec = student_lib.read_spec(dit) if dit is not None and os.path.isdir(dit) else None
    return Weights(dit, vae, spec, "student" if spec else "converted")


def check_resolution(height: int, width: int, flag: str = "--resolution") -> None:
    if height < 1 or width < 1 or height % PIXEL_MULTIPLE or width % PIXEL_MULTIPLE:
        near = lambda n: max(PIXEL_MULTIPLE, round(n / PIXEL_MULTIPLE) * PIXEL_MULTIPLE)  # noqa: E731
        raise errors.UsageError(f"{flag} {height}x{width}: height and width must be multiples of {PIXEL_MULTIPLE} "
                                "(the VAE's 16x downsampling times the DiT's 2x2 patches)",
                                fix=f"e.g. {flag} {near(height)}x{near(width)}")


def check_model_flags(*, dit: str | None, vae: str | None, fp8: bool = False, fp8_scales: str | None = None,
                      vae_fp8_scales: str | None = None, tae: str | None = None, text: str | None = None) -> None:
    """The weight flags the demo and `generate` share: consistent, and their files there."""
    if (dit is None) != (vae is None):
        raise errors.UsageError("--dit / --vae: give both, or neither (tiny random models)")
    if fp8_scales is not None and not fp8:
        raise errors.UsageError("--fp8-scales needs --fp8")
    if vae_fp8_scales is not None and vae is None:
        raise errors.UsageError("--vae-fp8-scales needs --vae (the demo's tiny VAE has no convs the FP8 kernel takes)")
    for flag, path in (("--dit", dit), ("--vae", vae), ("--fp8-scales", fp8_scales),
                       ("--vae-fp8-scales", vae_fp8_scales), ("--tae", tae), ("--text", text)):
        if path is not None:
            errors.existing(path, flag)


DECODERS = ("vae", "tiny")  # --decoder: the autoencoder's own decoder, or its trained tiny decoder


def decoder_checkpoint(decoder: str, tae: str | None, *, dit: str | None = None, vae: str | None = None,
                       random_weights: bool = False) -> str | None:
    """The tiny decoder that `--decoder` and `--tae` pick (None: the VAE decodes): `--tae CKPT` as
    given (an official taew2_2 file or a trained directory); `--decoder tiny` the bundled
    autoencoder's trained one (`student.bundled_tiny_decoder`, configs/synthetic_decoder.py:tae)."""
    if decoder not in DECODERS:
        raise errors.UsageError(f"--decoder {decoder}: unknown", fix=f"choose from {', '.join(DECODERS)}")
    if decoder == "vae":
        return tae
    if tae is not None:
        raise errors.UsageError("--decoder tiny / --tae: give one (--tae names its own checkpoint)")
    if dit is not None or vae is not None or random_weights:
        raise errors.UsageError("--decoder tiny: decodes the bundled autoencoder's latents, not with --dit / --vae "
                                "/ --random-weights", fix="pass --tae CKPT for other weights")
    path = student_lib.bundled_tiny_decoder()
    if path is None or student_lib.find_bundled() is None:
        raise errors.MissingFileError(
            f"--decoder tiny: no bundled student with a trained tiny decoder ({student_lib.weights_root()}/"
            f"{student_lib.TINY_DECODER})", fix="train one: python train.py --config configs/synthetic_decoder.py:tae")
    return path


def build_dit(dit_dir: str | None, seed: int) -> WanDiT:
    """The DiT: converted/official weights, or the demo's tiny random one (matching tiny VAE latents)."""
    if dit_dir is not None:
        return load_dit(dit_dir)
    z_dim = WanVAEConfig.tiny().z_dim
    return init_dit(WanDiTConfig.tiny(control="add-plus", in_channels=z_dim, out_channels=z_dim, control_channels=z_dim),
                    seed)


def build_modules(dit_dir: str | None, vae_dir: str | None, seed: int, *, fp8: bool = False,
                  fp8_scales: str | None = None, vae_fp8_scales: str | None = None) -> tuple[WanDiT, WanVAE]:
    """(DiT, VAE): converted weights, or tiny random ones. `fp8`: the DiT's block linears
    quantized to FP8 (`models.fp8.quantize_dit`; serving only); `fp8_scales`: with the static
    activation scales of this file (`serve.py calibrate-fp8`). `vae_fp8_scales`: the VAE decoder's
    convs in FP8 with these static scales (`serve.py calibrate-vae-fp8`; `vae_fp8.load_static`)."""
    check_model_flags(dit=dit_dir, vae=vae_dir, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales)
    dit = build_dit(dit_dir, seed)
    vae = load_vae(vae_dir) if vae_dir is not None else init_vae(WanVAEConfig.tiny(), seed)
    if fp8:
        dit = quantize_dit(dit)
        if fp8_scales is not None:
            dit = with_static_scales(dit, load_scales(fp8_scales))
    if vae_fp8_scales is not None:
        from rynn_jax.kernels import vae_fp8

        vae = vae_fp8.load_static(vae, vae_fp8_scales)
    return dit, vae


def build_world_model(dit_dir: str | None, vae_dir: str | None, seed: int, *, fp8: bool = False,
                      fp8_scales: str | None = None, vae_fp8_scales: str | None = None) -> WorldModel:
    return WorldModel(*build_modules(dit_dir, vae_dir, seed, fp8=fp8, fp8_scales=fp8_scales,
                                     vae_fp8_scales=vae_fp8_scales))


def build_world4d(dit_dir: str | None, vae_dir: str | None, seed: int) -> World4DModel:
    """RynnWorld-4D's DiT (a converted 4D directory, `load_dit4d`) and the VAE its three
    modalities share; neither given: tiny random ones (matching latents)."""
    from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d
    from rynn_jax.models.dit4d_weights import load_dit4d

    check_model_flags(dit=dit_dir, vae=vae_dir)
    if dit_dir is None:
        z = WanVAEConfig.tiny().z_dim
        tiny = WanDiT4DConfig.tiny(base=WanDiTConfig.tiny(num_layers=3, eps=1e-5, in_channels=z, out_channels=z))
        return World4DModel(init_dit4d(tiny, seed), init_vae(WanVAEConfig.tiny(), seed))
    return World4DModel(load_dit4d(dit_dir), load_vae(vae_dir))


def streaming_session(dit: str | None, vae: str | None, seed: int, *, fp8: bool = False,
                      fp8_scales: str | None = None, vae_fp8_scales: str | None = None, tae: str | None = None,
                      random_weights: bool = False) -> StreamingSession:
    """The causal student as a `StreamingSession` (not compiled yet), on the weights
    `choose_weights` picks: a student streams in the layout it was distilled for (its
    `student.json`), other networks in 2-frame blocks with a 4-frame rolling cache. Layers are
    unrolled for loaded weights only (faster serving, slower compiles: the tiny random model's short
    rollouts are dominated by compile time). `tae`: a tiny autoencoder decodes instead of the VAE, an
    official taew2_2 checkpoint or a trained tiny decoder's directory (`decoder_checkpoint`)."""
    return session_for(choose_weights(dit, vae, random_weights), seed, fp8=fp8, fp8_scales=fp8_scales,
                       vae_fp8_scales=vae_fp8_scales, tae=tae)


def session_for(w: Weights, seed: int, *, fp8: bool = False, fp8_scales: str | None = None,
                vae_fp8_scales: str | None = None, tae: str | None = None) -> StreamingSession:
    """`streaming_session` on weights already chosen (`choose_weights`)."""
    dit_model, vae_model = build_modules(w.dit, w.vae, seed, fp8=fp8, fp8_scales=fp8_scales,
                                         vae_fp8_scales=vae_fp8_scales)
    decoder = load_tae(tae) if tae else None
    return serving_session(dit_model, vae_model, spec=w.spec, decoder=decoder, unroll_layers=w.dit is not None)


def serving_session(dit_model, vae_model, *, spec: student_lib.StudentSpec | None = None, decoder=None,
                    unroll_layers: bool = True) -> StreamingSession:
    """The demo's and `serve.py generate`'s `StreamingSession` around built modules, with the
    served step (`SERVING_STEPS`): a student's own layout (`spec`: blocks, cache, steps, chunk
    re-anchoring), else 2-frame blocks, a 4-frame rolling cache, no re-anchoring."""
    if spec is None:
        return StreamingSession(dit_model, vae_model, causal.CausalConfig(frames_per_block=2, window_frames=4,
                                                                          policy="rolling"),
                                SERVING_STEPS, chunk_frames=None, unroll_layers=unroll_layers, decoder=decoder)
    steps = dataclasses.replace(SERVING_STEPS, num_steps=spec.steps.num_steps, shift=spec.steps.shift,
                                solver=spec.steps.solver, merge_clean_pass=spec.steps.solver == "x0_euler")
    return StreamingSession(dit_model, vae_model, spec.causal, steps, chunk_frames=spec.chunk_frames,
                            unroll_layers=unroll_layers, decoder=decoder)
