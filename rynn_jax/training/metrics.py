"""Observability: TensorBoard scalars (tensorboardX), a metrics.jsonl of every step, throughput and
MFU. Only process 0 writes."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.models.dit4d import WanDiT4DConfig


def model_flops_per_token(cfg: WanDiTConfig | WanDiT4DConfig, num_tokens: int, tokens_per_frame: int = 0) -> float:
    """Forward FLOPs per video token of the DiT (matmuls only, the MFU convention): dense layers
    plus self-attention (QKᵀ and AV over `num_tokens`) and cross-attention over the text slots.
    RynnWorld-4D (a token = one position in all three modalities): three branches plus, at each JA
    block, each modality's q, kv and out (8·d²) and QKᵀ, AV over the two other modalities' keys
    of its frame (`tokens_per_frame`) or of the whole clip."""
    if isinstance(cfg, WanDiT4DConfig):
        d = cfg.base.dim
        keys = 2 * (tokens_per_frame if cfg.joint_frame_wise else num_tokens)
        joint = 3 * (2 * 4 * d * d + 2 * 2 * d * keys)
        return 3 * model_flops_per_token(cfg.base, num_tokens) + len(cfg.joint_layers) * joint
    d, f, n = cfg.dim, cfg.ffn_dim, cfg.num_layers
    dense = n * (2 * 4 * d * d + 2 * 4 * d * d + 2 * 2 * d * f)  # self q,k,v,o; cross q,k,v,o; ffn
    attn = n * 2 * 2 * d * (num_tokens + cfg.text_len)
    return float(dense + attn)


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record arrives, not the stream at set-up: a run
    started in-process (tests, notebooks) must not keep a captured stream that is closed later."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def setup_logging() -> None:
    """INFO lines of the run (config, resume, saves) on stderr; libraries' INFO chatter (orbax's
    per-save lines, absl) stays off. Importing orbax installs a plain root StreamHandler bound to the
    stderr of that moment (its module-level logging calls configure the root logger); that one is
    replaced, other handlers (pytest's capture, an application's own) are left alone."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if type(h) is logging.StreamHandler or type(h) is _Stderr:
            root.removeHandler(h)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in ("absl", "orbax", "jax", "grain"):
        logging.getLogger(name).setLevel(logging.WARNING)


class MetricWriter:
    """`resume_step`: lines of later steps (written by a run that died before its next checkpoint)
    are dropped first, since this run writes them again: each step appears once in the file."""

    def __init__(self, log_dir: str, resume_step: int = 0):
        self.enabled = bool(log_dir) and jax.process_index() == 0
        self.tb = None
        self.jsonl = None
        if self.enabled:
            from tensorboardX import SummaryWriter  # only where logging is on
            os.makedirs(log_dir, exist_ok=True)
            self.tb = SummaryWriter(log_dir)
            path = os.path.join(log_dir, "metrics.jsonl")
            _truncate_after(path, resume_step)
            self.jsonl = open(path, "a")

    def step(self, step: int, record: dict[str, float]) -> None:
        """Every step: one JSON line (loss, norms) — what resume tests and plots read."""
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"step": step, **record}) + "\n")
            self.jsonl.flush()

    def scalars(self, step: int, scalars: dict[str, float]) -> None:
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.jsonl is not None:
            self.jsonl.close()


def _truncate_after(path: str, step: int) -> None:
    """Keep the lines of steps ≤ `step` (a torn last line is dropped too); atomic rewrite."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the line a killed run was writing
                continue
            if record.get("step", 0) <= step:
                keep.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)


class Throughput:
    """Steps/s, tokens/s and MFU over the steps since the last call."""

    def __init__(self, tokens_per_step: int, flops_per_step: float, peak_flops: float):
        self.tokens_per_step, self.flops_per_step, self.peak_flops = tokens_per_step, flops_per_step, peak_flops
        self.t0, self.steps = time.perf_counter(), 0

    def tick(self) -> None:
        self.steps += 1

    def read(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        steps_per_s = self.steps / dt
        self.t0, self.steps = time.perf_counter(), 0
        return {"perf/steps_per_s": steps_per_s,
                "perf/tokens_per_s": steps_per_s * self.tokens_per_step,
                "perf/mfu": steps_per_s * self.flops_per_step / self.peak_flops}
