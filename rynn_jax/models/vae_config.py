"""Configuration of the Wan2.2 VAE (models/vae.py): the released architecture, a tiny one for tests,
the synthetic world's autoencoder, and which formulation computes the causal convs."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, Protocol, get_args

import jax
from flax import nnx

# Per-channel statistics of Wan2.2 VAE latents (Wan2.2 `vae2_2.py`, diffusers config `latents_*`).
WAN22_LATENTS_MEAN: tuple[float, ...] = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD: tuple[float, ...] = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)

ConvImpl = Literal["fold2d", "3d", "sum2d"]
XLA_CONV_IMPLS: tuple[str, ...] = get_args(ConvImpl)


class KernelConvFn(Protocol):
    """A conv injected into the VAE (WanVAEConfig.kernel_conv) for the convs it takes, instead of
    XLA's: the Hopper kernel, rynn_jax/kernels/vae_conv.py. Hashable: it is part of the config."""

    impl: str  # its name, for logs and result files (WanVAEConfig.conv_name)

    def attach(self, conv: nnx.Module, kernel_thwio: jax.Array, stride: tuple[int, int, int]) -> None:
        """At construction: give the conv module whatever state this conv keeps on it."""

    def __call__(self, conv: nnx.Module, x: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None,
                 stride: tuple[int, int, int], pad_hw: tuple[tuple[int, int], tuple[int, int]]) -> jax.Array | None:
        """The conv over past ⧺ x without bias, or None where it does not apply (XLA's then)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanVAEConfig:
    base_dim: int = 160  # encoder width at full (patchified) resolution
    decoder_base_dim: int = 256  # decoder width at full (patchified) resolution
    # the decoder's width multiplier per level (empty: dim_mult); e.g. (1, 1, 1) keeps the
    # full-resolution stage as wide as the low-resolution ones, where a decoder draws detail
    decoder_dim_mult: tuple[int, ...] = ()
    z_dim: int = 48  # latent channels (the encoder emits 2·z_dim: mean and log-variance)
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)  # width multiplier per level; ×2 spatial between
    num_res_blocks: int = 2  # residual blocks per encoder level (decoder levels use one more)
    temporal_downsample: tuple[bool, ...] = (False, True, True)  # per down step: also halve time?
    patch_size: int = 2  # space-to-channel patchify before the encoder (3 → 3·p² channels)
    image_channels: int = 3  # RGB
    latents_mean: tuple[float, ...] = WAN22_LATENTS_MEAN  # per-channel latent mean (normalize)
    latents_std: tuple[float, ...] = WAN22_LATENTS_STD  # per-channel latent std (normalize)
    dtype: str = "float32"  # compute dtype of convs/attention; norms always reduce in float32
    param_dtype: str = "float32"  # storage dtype of parameters
    precision: Literal["default", "high", "highest"] = "default"  # conv precision; highest: no TF32
    # How XLA computes a causal k_t×3×3 conv (same function, different kernels; see _conv):
    # "fold2d" (serving) the k_t input frames stacked on channels, one 2-D conv (bench_vae on an
    # H200: streaming decode 61.2 → 54.1 ms, encode 19.3 → 15.8 ms per chunk; also faster on CPU);
    # for tests and benches: "3d" one 3-D conv; "sum2d" k_t 2-D convs summed in float32 (slowest).
    # 1×1×1 convs are 2-D unless "3d".
    conv_impl: ConvImpl = "fold2d"
    # The injected conv the decoder runs the convs it takes through (the Hopper FP8 kernel; set with
    # rynn_jax.kernels.vae_conv.configure); None: XLA's conv_impl for every conv.
    kernel_conv: KernelConvFn | None = None

    def __post_init__(self):
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise ValueError(f"latents_mean/std need {self.z_dim} values each")
        if self.decoder_dim_mult and len(self.decoder_dim_mult) != len(self.dim_mult):
            raise ValueError(f"decoder_dim_mult needs one multiplier per level ({len(self.dim_mult)}), "
                             f"got {self.decoder_dim_mult}")
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError("temporal_downsample needs one flag per down step (len(dim_mult) - 1)")
        if self.kernel_conv is not None and not callable(self.kernel_conv):
            raise ValueError(f"kernel_conv must be an injected conv (rynn_jax.kernels.vae_conv.KernelConv), "
                             f"got {self.kernel_conv!r}")
        if self.conv_impl not in XLA_CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {XLA_CONV_IMPLS}, got {self.conv_impl!r} "
                             "(the kernel ones: rynn_jax.kernels.vae_conv.configure)")

    # Fields older versions wrote to config.json, dropped on load when at their old default
    # (converted_weights.load_config): the kernel's FP8 scaling now lives in kernel_conv.
    DROPPED_FIELDS: ClassVar[dict[str, Any]] = {"conv_fp8_scales": "per_call"}

    @property
    def conv_name(self) -> str:
        """What computes the convs: the injected conv's name, else conv_impl."""
        return self.conv_impl if self.kernel_conv is None else self.kernel_conv.impl

    @property
    def temporal_stride(self) -> int:
        return 2 ** sum(self.temporal_downsample)

    @property
    def spatial_stride(self) -> int:
        return self.patch_size * 2 ** (len(self.dim_mult) - 1)

    @property
    def patch_channels(self) -> int:
        return self.image_channels * self.patch_size**2

    @classmethod
    def wan22(cls, **overrides) -> "WanVAEConfig":
        """The released Wan2.2 VAE (TI2V-5B): 704,688,668 parameters."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "WanVAEConfig":
        """A ~1.2M-parameter VAE of the same structure (every layer kind), for tests."""
        base = dict(base_dim=8, decoder_base_dim=12, z_dim=4, num_res_blocks=1,
                    latents_mean=(0.1, -0.2, 0.3, -0.05), latents_std=(0.5, 1.5, 0.8, 1.2))
        return cls(**{**base, **overrides})

    @classmethod
    def synthetic(cls, **overrides) -> "WanVAEConfig":
        """The autoencoder trained on the synthetic world (rynn_jax/training/autoencoder.py):
        stride 4×8×8 (128×224 video → 16×28 latents, 48× compression), 16 latent channels,
        4,709,420 parameters (9.4 MB in bfloat16). Widths end on a repeated multiplier as in
        Wan2.2: a level's parameter-free shortcut (`avg_down`) folds its input into its output
        channels, so the last (time- and space-preserving) level cannot widen; (1, 2, 4) fails.
        The latent statistics are placeholders until training measures them."""
        z = overrides.get("z_dim", 16)
        base = dict(base_dim=32, decoder_base_dim=48, z_dim=z, dim_mult=(1, 2, 2), num_res_blocks=1,
                    temporal_downsample=(True, True), latents_mean=(0.0,) * z, latents_std=(1.0,) * z)
        return cls(**{**base, **overrides})
