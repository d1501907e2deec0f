"""Training configuration: frozen dataclasses, one comment per field; recipes live in `configs/*.py`
(each defines `get_config() -> TrainConfig`), command-line overrides are `--set a.b=value`."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import time
import typing
from typing import Any, Literal

from rynn_jax import errors

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.models.dit4d import WanDiT4DConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.lora import LoraConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 2e-5  # peak learning rate (paper: 2e-5 stage 0/1, 1e-5 stage 2)
    warmup_steps: int = 200  # linear warm-up from 0
    schedule: Literal["cosine", "constant", "tri_stage"] = "cosine"  # after warm-up (released code: cosine)
    end_lr_factor: float = 0.0  # cosine / tri_stage end at lr · end_lr_factor
    hold_steps: int = 0  # tri_stage: steps at lr after the warm-up, then exponential decay (policy head)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01  # AdamW decoupled decay
    grad_clip: float = 1.0  # global-norm clipping; 0 = off
    ema_decay: float = 0.999  # EMA of trained params, kept in the state; 0 = no EMA
    # EMA decay min(ema_decay, (1 + step) / (10 + step)) (TF's ExponentialMovingAverage with
    # num_updates): the EMA starts from the initial params, so without the ramp a run of n ≲ 1 / (1 −
    # ema_decay) steps exports ema_decay^n of its initialisation (0.999 over 887 steps: 41 %)
    ema_warmup: bool = False
    # Storage dtype of Adam's first moment ("bfloat16" halves it: 10 GB less for the 5B model, the
    # second moment stays float32); "float32" = the params' float32 master dtype.
    mu_dtype: Literal["float32", "bfloat16"] = "float32"
    # RynnWorld-4D: peak lr of the joint-attention output projections (the release's `joint_out`
    # group, same warm-up and schedule); 0 = `lr` like every other parameter.
    joint_out_lr: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    shift: float = 5.0  # sigma sampling: u ~ U(0,1), sigma = shift·u / (1 + (shift−1)·u)
    exclude_first_frame: bool = True  # frame 0 is the clean reference image latent (TI2V)
    use_control: bool = True  # feed the control latent (needs model.control != "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class World4DLossConfig:
    """The objective of a RynnWorld-4D model (training/loss4d.py), in place of LossConfig."""
    shift: float = 5.0  # sigma sampling, as LossConfig.shift
    flow_weight: float = 1.0  # λ_flow (stage 1: 0.5, stages 2–3: 1.0)
    branch_dropout: float = 0.0  # per-sample probability that depth or flow frames 1.. become noise
    rgb_decay_steps: int = 0  # cosine 1 → 0 of the RGB joint injection over these steps (0 = off)
    train: Literal["all", "joint", "no_joint"] = "all"  # what the optimizer updates (stage 2: "joint")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    kind: Literal["synthetic", "latents"] = "latents"
    batch_size: int = 8  # global batch (all processes); per step, before gradient accumulation split
    # latents: {name: shard glob}; ArrayRecord shards written by rynn_jax.data.preencode
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    weights: dict[str, float] = dataclasses.field(default_factory=dict)  # per-batch mixture weights
    seed: int = 0  # shuffle seed
    worker_count: int = 0  # grain worker processes
    text_len: int = 512  # text embedding slots (= model.text_len)
    # synthetic (tiny/CI): a few fixed prototype clips plus noise, so there is something to learn
    synthetic_shape: tuple[int, int, int] = (3, 4, 4)  # latent (T, H, W)
    synthetic_clips: int = 4  # distinct prototypes


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    dir: str = ""  # checkpoint directory ("" = none); a run with existing steps resumes from them
    every: int = 500  # save every N steps (and at the end)
    keep: int = 3  # newest N kept
    async_save: bool = True  # write in a background thread while training continues
    init_from: str = ""  # converted base weights (rynn_jax.convert output) loaded before step 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogConfig:
    dir: str = ""  # TensorBoard event files + metrics.jsonl ("" = none)
    every: int = 10  # scalars every N steps (loss is checked for finiteness every step)
    progress: bool = True  # tqdm progress bar
    peak_tflops_per_device: float = 989.0  # for MFU (H100/H200 dense bf16)
    sample_every: int = 0  # call sample hooks every N steps (0 = never)
    sample_vae: str = ""  # VAE for sample videos: a converted/official VAE path, "tiny" (random, CI), "" = none
    sample_steps: int = 8  # sampler steps for sample videos


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    # the 2D world model, or RynnWorld-4D (then loss is a World4DLossConfig and LoRA is off)
    model: WanDiTConfig | WanDiT4DConfig = dataclasses.field(default_factory=WanDiTConfig)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    loss: LossConfig | World4DLossConfig = dataclasses.field(default_factory=LossConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    ckpt: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    total_steps: int = 2000  # optimizer steps (the cosine schedule spans them)
    grad_accum: int = 1  # micro-batches per step; batch_size must divide by it
    seed: int = 0  # params init, noise and timesteps (fold_in(rng, step))
    frozen_dtype: str = "float32"  # storage of frozen (LoRA base) params; "bfloat16" halves them
    distributed: bool = False  # multi-host: jax.distributed.initialize() first
    min_sharded_size: int = 2 ** 22  # startup check: params this large must not be replicated
    # Fault injection for tests: send this process `debug_kill_signal` right after dispatching
    # this step (0 = never); SIGKILL dies at once, SIGINT/SIGTERM stop cleanly after the step.
    debug_kill_at_step: int = 0
    debug_kill_signal: Literal["SIGKILL", "SIGINT", "SIGTERM"] = "SIGKILL"


# --------------------------------------------------------------------------------------------------
# Loading and overrides
# --------------------------------------------------------------------------------------------------


def run_recipe(path: str | os.PathLike[str], want: type | tuple[type, ...], arg: str = "") -> Any:
    """Run the recipe file at `path` and return its `get_config()` (`get_config(arg)` when `arg`),
    checked to be a `want` (or one of them). A missing or broken recipe is a user error naming `--config`."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise errors.UsageError(f"--config {path}: no such recipe file", fix="pass a file under configs/")
    spec = importlib.util.spec_from_file_location("rynn_config", path)
    if spec is None or spec.loader is None:
        raise errors.UsageError(f"--config {path}: not a Python recipe file", fix="pass a file under configs/")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise errors.UsageError(f"--config {path}:{e.lineno}: {e.msg}") from None
    if not hasattr(module, "get_config"):
        raise errors.UsageError(f"--config {path}: defines no get_config()", fix="pass a file under configs/")
    cfg = module.get_config(arg) if arg else module.get_config()
    if not isinstance(cfg, want):
        names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
        raise errors.UsageError(f"--config {path}: get_config() returned {type(cfg).__name__}, not {names}")
    return cfg


def load_config(path: str | os.PathLike[str], types: tuple[type, ...] = (TrainConfig,)) -> Any:
    """Run a recipe file and return its `get_config()`, which must be one of `types` (train.py
    also takes training.autoencoder's AutoencoderTrainConfig). `path:ARG` calls get_config(ARG)
    (e.g. configs/world4d.py:2, a stage)."""
    path, _, arg = os.fspath(path).partition(":")
    return run_recipe(path, types, arg)


def with_run_dir(cfg: Any, config_path: str, root: str = "runs") -> Any:
    """A run that names neither `ckpt.dir` nor `log.dir` writes to `runs/<recipe>-<time>/`
    (`ckpt/` and `logs/`), so a run never trains without saving."""
    if cfg.ckpt.dir or cfg.log.dir:
        return cfg
    stem = os.path.splitext(os.path.basename(config_path.partition(":")[0]))[0]
    run = os.path.join(root, f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    return dataclasses.replace(cfg, ckpt=dataclasses.replace(cfg.ckpt, dir=os.path.join(run, "ckpt")),
                               log=dataclasses.replace(cfg.log, dir=os.path.join(run, "logs")))


def _parse(text: str, like: Any, where: str) -> Any:
    """Parse `text` as a Python literal typed like the current value `like`."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # bare strings: --set ckpt.dir=/tmp/x
    if isinstance(like, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} wants True/False, got {text!r}")
    elif isinstance(like, float) and isinstance(value, int):
        value = float(value)
    elif isinstance(like, tuple) and isinstance(value, list | tuple):
        value = tuple(value)
    if like is not None and not isinstance(value, type(like)):
        raise ValueError(f"{where} is a {type(like).__name__}, got {text!r}")
    return value


def override(cfg: Any, key: str, text: str) -> Any:
    """cfg with the dotted field `key` (dataclass fields, then dict keys) set from `text`."""
    head, _, rest = key.partition(".")
    if dataclasses.is_dataclass(cfg):
        names = {f.name for f in dataclasses.fields(cfg)}
        if head not in names:
            raise KeyError(f"unknown config field {head!r} (have {sorted(names)})")
        current = getattr(cfg, head)
        new = override(current, rest, text) if rest else _parse(text, current, key)
        hint = typing.get_type_hints(type(cfg))[head]
        if typing.get_origin(hint) is Literal and new not in typing.get_args(hint):
            raise ValueError(f"{head}={text!r} must be one of {list(typing.get_args(hint))}")
        return dataclasses.replace(cfg, **{head: new})
    if isinstance(cfg, dict):
        if rest:
            return {**cfg, head: override(cfg[head], rest, text)}
        like = next(iter(cfg.values()), None)
        return {**cfg, head: _parse(text, like, key)}
    raise TypeError(f"cannot descend into {type(cfg).__name__} at {key!r}")


def apply_overrides(cfg: Any, items: list[str]) -> Any:
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise errors.UsageError(f"--set {item!r}: not KEY=VALUE", fix="e.g. --set optim.lr=1e-5")
        try:
            cfg = override(cfg, key.strip(), text.strip())
        except (ValueError, KeyError, TypeError) as exc:  # name the whole override, not just the innermost field
            raise errors.UsageError(f"--set {item!r}: {str(exc).strip(chr(34))}") from None
    return cfg


def to_dict(cfg: Any) -> Any:
    """JSON-able view (for logs and the checkpoint directory)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, tuple | list):
        return [to_dict(v) for v in cfg]
    return cfg

