"""The policy's configuration: frozen dataclasses, one comment per field (docs/POLICY.md).

`PolicyConfig.full(...)` is SPEC size (Flow Former 6 layers over 21 × 16 learned queries, a 384-wide
action head with 4 + 4 layers, chunks of 10 × 54 actions); `PolicyConfig.tiny(...)` is the CPU
test size. The vision encoder is one of three (`encoder`):

    world4d      frozen RynnWorld-4D features of all three branches at block `backbone.layer`
    world4d_rgb  the same forward, only the RGB branch's third of the channels
    cnn          a small CNN over RGB + depth, trained from scratch with the head
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Encoder = Literal["world4d", "world4d_rgb", "cnn"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackboneConfig:
    """The frozen RynnWorld-4D feature pass (encoders world4d / world4d_rgb)."""
    dit: str = ""  # converted WanDiT4D directory; "tiny" = the toy model with random weights (tests);
    # "random" = SPEC size, random bf16 weights, only the blocks the feature pass runs (latency)
    vae: str = ""  # VAE directory (rynn_jax.converted_weights layout); "tiny" / "random" as for dit
    layer: int = 15  # block whose output is the feature (0-based); later blocks are not run
    timestep: float = 500.0  # model timestep of frames 1.. (≈ σ 0.5); frame 0 (the observation) at 0
    latent_frames: int = 21  # latent frames the backbone sees: frame 0 observed, the rest noise
    image_size: tuple[int, int] = (480, 640)  # (H, W) the observation is resized to before the VAE
    noise_seed: int = 0  # key of the noise frames at inference (features are deterministic)
    # the branches' block linears as FP8 GEMMs (models/fp8.quantize_dit: per-channel weight scales,
    # per-token activation scales); the joint attention, embeddings and the VAE stay as loaded
    fp8: bool = False
    # static FP8 activation scales instead of per-token ones: a file fp8.save_scales wrote for this
    # backbone after fp8.calibrate (needs fp8)
    fp8_scales: str = ""
    # the backbone's unmasked attention as cuDNN's FP8 flash attention (Hopper GPU;
    # models/fp8_attention.py), with bf16 or FP8 linears
    fp8_attention: bool = False
    # the serving layout (models/dit4d.unrolled4d): per-layer weights, joint attention placed
    # statically; False keeps the stacked layer scan. Per-token FP8 (fp8 without fp8_scales) stays
    # stacked either way: it is the form World4DFeatures.calibrate_fp8 reads.
    unrolled: bool = True

    def __post_init__(self) -> None:
        if self.fp8_scales and not self.fp8:
            raise ValueError("backbone.fp8_scales needs backbone.fp8 = True")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CnnConfig:
    """The from-scratch image encoder (the paper's ResNet-18 row, smaller)."""
    channels: tuple[int, ...] = (32, 64, 128, 256)  # one stride-2 3×3 conv stage each
    image_size: tuple[int, int] = (240, 320)  # (H, W) of the RGB + depth input
    groups: int = 8  # GroupNorm groups


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompressorConfig:
    """Flow Former: per-frame Perceiver with learned queries + temporal attention."""
    in_dim: int = 9216  # feature channels (3 branches × 3072)
    hidden_dim: int = 768  # token MLP in_dim → hidden_dim → dim
    dim: int = 384
    num_frames: int = 21  # frames of the feature grid (one learned time embedding each)
    queries_per_frame: int = 16  # learned queries per frame (21 × 16 = 336 vision tokens)
    layers: int = 6
    heads: int = 8  # Perceiver heads (× head_dim); the temporal attention splits `dim` into `heads`
    head_dim: int = 64
    ff_mult: int = 4

    @property
    def num_tokens(self) -> int:
        return self.num_frames * self.queries_per_frame


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadConfig:
    """The flow-matching action head: encoder over goal / vision / proprioception, decoder over
    the action chunk with adaLN on the flow time."""
    dim: int = 384
    heads: int = 8
    encoder_layers: int = 4
    decoder_layers: int = 4
    goal_dim: int = 4096  # text embedding width (umT5-XXL)
    goal_len: int = 32  # goal tokens: the first goal_len of the text embedding
    proprio_dim: int = 54  # observation.state, raw (not normalised)
    action_dim: int = 54
    chunk: int = 10  # actions predicted per observation
    attn_dropout: float = 0.3
    resid_dropout: float = 0.1
    mlp_dropout: float = 0.05
    time_scale: float = 5.0  # the sinusoid sees time_scale · t


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    encoder: Encoder = "world4d"
    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    cnn: CnnConfig = dataclasses.field(default_factory=CnnConfig)
    compressor: CompressorConfig = dataclasses.field(default_factory=CompressorConfig)
    head: HeadConfig = dataclasses.field(default_factory=HeadConfig)
    sample_steps: int = 4  # Euler steps at t = 0, 1/n, …
    seed: int = 0  # parameter init

    def __post_init__(self) -> None:
        if self.encoder not in ("world4d", "world4d_rgb", "cnn"):
            raise ValueError(f"encoder must be world4d, world4d_rgb or cnn, got {self.encoder!r}")
        if self.sample_steps < 1:
            raise ValueError(f"sample_steps must be ≥ 1, got {self.sample_steps}")
        if self.encoder == "cnn" and self.compressor.num_frames != 1:
            raise ValueError("the cnn encoder sees one frame: compressor.num_frames must be 1")
        if self.encoder != "cnn" and self.compressor.num_frames != self.backbone.latent_frames:
            raise ValueError(f"compressor.num_frames {self.compressor.num_frames} must equal "
                             f"backbone.latent_frames {self.backbone.latent_frames}")

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of the observation the vision encoder reads."""
        return self.cnn.image_size if self.encoder == "cnn" else self.backbone.image_size

    @classmethod
    def full(cls, encoder: Encoder = "world4d", **overrides) -> "PolicyConfig":
        """SPEC size: 5B-branch features (3 × 3072, or 3072 for world4d_rgb) at block 15."""
        in_dim = {"world4d": 3 * 3072, "world4d_rgb": 3072, "cnn": CnnConfig().channels[-1]}[encoder]
        frames = 1 if encoder == "cnn" else 21
        compressor = CompressorConfig(in_dim=in_dim, num_frames=frames,
                                      queries_per_frame=16 if encoder != "cnn" else 336)
        return cls(**{"encoder": encoder, "compressor": compressor, **overrides})

    @classmethod
    def tiny(cls, encoder: Encoder = "cnn", **overrides) -> "PolicyConfig":
        """Toy size for tests and CPU smoke runs (the tiny WanDiT4D: 48-wide branches, 3 blocks;
        goal width = its text width 24)."""
        frames = 1 if encoder == "cnn" else 3
        in_dim = {"world4d": 3 * 48, "world4d_rgb": 48, "cnn": 32}[encoder]
        return cls(**{
            "encoder": encoder,
            "backbone": BackboneConfig(dit="tiny", vae="tiny", layer=1, latent_frames=frames, image_size=(64, 128)),
            "cnn": CnnConfig(channels=(16, 32), image_size=(64, 112), groups=4),
            "compressor": CompressorConfig(in_dim=in_dim, hidden_dim=64, dim=32, num_frames=frames,
                                           queries_per_frame=4, layers=2, heads=2, head_dim=16),
            "head": HeadConfig(dim=32, heads=2, encoder_layers=2, decoder_layers=2, goal_dim=24, goal_len=4,
                               attn_dropout=0.0, resid_dropout=0.0, mlp_dropout=0.0),
            **overrides})


def to_dict(cfg: PolicyConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(raw: dict[str, Any]) -> PolicyConfig:
    """Inverse of `to_dict` (JSON lists back to tuples); unknown fields are an error."""
    def build(cls, d: dict):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
        out = {}
        for k, v in d.items():
            sub = {"backbone": BackboneConfig, "cnn": CnnConfig, "compressor": CompressorConfig,
                   "head": HeadConfig}.get(k) if cls is PolicyConfig else None
            out[k] = build(sub, v) if sub else tuple(v) if isinstance(v, list) else v
        return cls(**out)
    return build(PolicyConfig, raw)
