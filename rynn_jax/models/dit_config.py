"""Configuration of the Wan2.2 TI2V DiT (models/dit.py): the 5B defaults, a tiny model for tests,
and the knobs that change how it runs (precision, FP8, attention, remat, token padding)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from rynn_jax.models.control import MODES as CONTROL_MODES


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanDiTConfig:
    dim: int = 3072  # model width (heads × head_dim)
    num_layers: int = 30  # transformer blocks, run with scan
    num_heads: int = 24  # attention heads; head_dim = dim // num_heads
    ffn_dim: int = 14336  # GELU-tanh FFN hidden width
    freq_dim: int = 256  # sinusoidal timestep embedding width
    in_channels: int = 48  # VAE latent channels in
    out_channels: int = 48  # velocity channels out
    text_dim: int = 4096  # umT5-XXL hidden size
    text_len: int = 512  # text context is trimmed/zero-padded to this many slots
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (t, h, w) patch of the latent per token
    eps: float = 1e-6  # layer/RMS norm epsilon
    rope_theta: float = 10000.0
    rope_max_len: int = 1024  # positions available per RoPE axis
    dtype: str = "float32"  # compute dtype of matmuls/attention ("bfloat16" for speed)
    param_dtype: str = "float32"  # storage dtype of parameters
    # auto: cuDNN flash on GPU in bf16/fp16; "cudnn_fp8": unmasked attention as cuDNN's FP8 flash
    # attention (serving, Hopper; models/fp8_attention.py), masked attention as "cudnn"
    attention: Literal["auto", "xla", "cudnn", "cudnn_fp8"] = "auto"
    # Activation checkpointing per block: "full" saves nothing, "save_dots" the linear layers'
    # outputs, "save_dots_attn" those and the cuDNN attention outputs (_REMAT_POLICIES).
    remat: Literal["none", "full", "save_dots", "save_dots_attn"] = "none"
    # Blocks per iteration of the layer scan. num_layers unrolls it fully: no device loop, and XLA
    # sees each layer's weights as a static slice (an inference knob; compiles num_layers blocks).
    scan_unroll: int = 1
    # The plain forward pads the token sequence at its tail to a multiple of this (pads are masked
    # out of self-attention keys and dropped before the head, so outputs are unchanged). On H200,
    # cuBLAS falls back to slow sm80 kernels for weight-gradient GEMMs that contract over a token
    # count that is not a multiple of 8, e.g. 8190 = 21 × 390 (bench/results: 5B step 0.90 → 0.8x s).
    token_multiple: int = 1
    # Action control (RynnWorld-Teleop, see models/control.py); "none" is the plain Wan2.2 model.
    # The released code's modes: "add" (no alignment), "add-plus" (aligned), "concat" (the ablation).
    control: Literal["none", "add", "add-plus", "concat"] = "none"
    control_channels: int = 48  # channels of the skeleton video's VAE latent
    control_gate_init: float = 0.1  # α at initialisation
    control_stats_momentum: float = 0.01  # momentum of the running statistics (add-plus)
    # μ_z, σ_z without ground truth (add-plus): "running" = the running clean-video-latent statistics
    # recorded in training (the control's own when none were); "prior" = the fixed prior below.
    control_video_stats: Literal["running", "prior"] = "running"
    control_prior_mean: float = 0.0  # μ_z of the fixed prior (control_video_stats="prior")
    control_prior_std: float = 0.8  # σ_z likewise
    # Serving: block linears as FP8 e4m3 GEMMs with per-channel weight scales (fp8.quantize_dit)
    # and activation scales per token at every call, or "static": one calibrated scale per linear
    # (fp8.calibrate; no max reduction per call, the quantization fuses into the producer).
    fp8: bool = False
    fp8_activations: Literal["per_token", "static"] = "per_token"

    def __post_init__(self) -> None:
        if self.control not in CONTROL_MODES:
            raise ValueError(f"control must be one of {CONTROL_MODES} (add: no alignment, add-plus: aligned), "
                             f"got {self.control!r}")
        if self.control_video_stats not in ("running", "prior"):
            raise ValueError(f"control_video_stats must be 'running' or 'prior', got {self.control_video_stats!r}")
        if self.token_multiple < 1:
            raise ValueError(f"token_multiple must be ≥ 1, got {self.token_multiple}")
        if self.fp8_activations not in ("per_token", "static"):
            raise ValueError(f"fp8_activations must be 'per_token' or 'static', got {self.fp8_activations!r}")
        if self.fp8_activations == "static" and not self.fp8:
            raise ValueError("fp8_activations='static' needs fp8=True")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_dim_out(self) -> int:
        return math.prod(self.patch_size) * self.out_channels

    @classmethod
    def ti2v_5b(cls, **overrides) -> "WanDiTConfig":
        """Wan2.2-TI2V-5B (the defaults)."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "WanDiTConfig":
        """A few-thousand-parameter model for tests and the CPU demo."""
        base = dict(dim=48, num_layers=2, num_heads=4, ffn_dim=96, freq_dim=32,
                    in_channels=8, out_channels=8, control_channels=8, text_dim=24, text_len=16)
        return cls(**{**base, **overrides})
