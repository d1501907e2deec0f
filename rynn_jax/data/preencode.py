"""Offline pre-encoding: clips → VAE latents in ArrayRecord shards, once, so training reads latents.

Per clip we store what the released RynnWorld `sample_data` latents hold, channels-last:
  video_latents          (T', h, w, C)  VAE(video)                     T' = 1 + (T-1)/4
  control_video_latents  (T', h, w, C)  VAE(rendered skeleton video)
  img_latent             (1, h, w, C)   VAE(first frame alone)         the TI2V reference image
  text_embedding         (S, D)         umT5 embedding of the prompt, trimmed to its length
plus `text`, `actions` (T, 54), `has_actions`, `clip_id`, `episode`, `start`, `source`.

With `--geometry` (RynnWorld-4D; the synthetic world's episodes, which hold exact depth and flow)
each record also holds the clip's depth and flow, encoded as videos the way the release encodes
them (`data/geometry_video.py`: ⌊d/5·255⌋ grey, Middlebury flow colours with a white frame 0) and
through the same VAE as the RGB — the keys the 4D loss reads (`training/loss4d.py`):
  depth_latents, flow_latents          (T', h, w, C)  VAE(depth video), VAE(flow video)
  depth_img_latent, flow_img_latent    (1, h, w, C)   their frame 0 alone (flow: the white frame)

Work split: the source's clip index (deterministic given the files and ClipConfig) is cut into
shards of `records_per_shard` consecutive clips; worker w of n does shards w, w+n, ... Resumable:
a finished shard is a renamed file, so a re-run skips it; the index fingerprint is recorded on
the first run and a re-run over changed files refuses once a shard exists (shards would no longer
line up; before that, the new index simply replaces the old one).

Everything cheap is checked before the VAE is built: the flags, the dataset's clip index, and —
where the source can tell a clip's prompt from its metadata (robot, EgoDex) — that every prompt
has a text embedding. A failed or interrupted run leaves no `.tmp` shard behind.

CLI:
  python -m rynn_jax.data.preencode --source egodex --root /data/egodex --out /data/latents/egodex \
      --vae /ckpt/wan22_vae --text-embeddings /data/text_embeddings [--worker 0 --num-workers 8]
  python -m rynn_jax.data.preencode --source robot --root data/robot --out data/latents/robot \
      --vae tiny --allow-missing-text --height 96 --width 160     # smoke run, meaningless latents
  python -m rynn_jax.data.preencode --source robot --root data/synthetic/train --out data/synthetic/latents4d \
      --vae weights/synthetic/autoencoder --geometry ...            # + depth and flow latents (RynnWorld-4D)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from rynn_jax import errors

from rynn_jax.data import shards as shards_lib
from rynn_jax.data.clips import ClipConfig
from rynn_jax.data.errors import SKIPPED, DataError, handle
from rynn_jax.data.source import ClipSource

log = logging.getLogger("rynn_jax.data")

VideoEncoder = Callable[[np.ndarray], np.ndarray]  # (B, T, H, W, 3) float32 [-1, 1] → (B, T', h, w, C)
ControlRenderer = Callable[[dict], np.ndarray]  # sample → (T, H, W, 3) uint8 skeleton video
TextEmbedder = Callable[[str], np.ndarray]  # prompt → (S, D) float32
# (episode directory, sample) → {"depth": (T, H, W, 3) uint8, "flow": (T, H, W, 3) uint8}
GeometryRenderer = Callable[[str, dict], dict[str, np.ndarray]]
GEOMETRY_STREAMS = ("depth", "flow")  # stored as <name>_latents, <name>_img_latent


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreencodeConfig:
    records_per_shard: int = 64  # clips per ArrayRecord file
    latent_dtype: str = "float16"  # storage dtype of the latents
    worker: int = 0  # this worker's number ...
    num_workers: int = 1  # ... of this many (separate processes or hosts)


def to_unit_range(video_uint8: np.ndarray) -> np.ndarray:
    return video_uint8.astype(np.float32) / 127.5 - 1.0


def index_fingerprint(source: ClipSource, geometry: bool = False) -> str:
    """The clip index (and whether records carry depth/flow): shards of one output directory
    must agree on it."""
    h = hashlib.sha256(repr(source.cfg).encode())
    if geometry:
        h.update(b"geometry\n")
    for r in source.index():
        h.update(f"{r.episode}\0{r.start}\n".encode())
    return h.hexdigest()


def encode_clip(sample: dict, source_name: str, episode: str, start: int, *,
                encode_video: VideoEncoder, render_control: ControlRenderer,
                embed_text: TextEmbedder, latent_dtype: str,
                render_geometry: GeometryRenderer | None = None, episode_dir: str = "") -> bytes:
    video = to_unit_range(sample["video"])[None]
    streams = {"control": render_control(sample)}
    if render_geometry is not None:
        geometry = render_geometry(episode_dir, sample)
        streams.update((name, geometry[name]) for name in GEOMETRY_STREAMS)
    streams = {name: to_unit_range(np.asarray(v))[None] for name, v in streams.items()}
    for name, v in streams.items():
        if v.shape != video.shape:
            raise ValueError(f"{name} video {v.shape} does not match video {video.shape}")
    # one call for every clip, one for every frame 0
    lat = np.asarray(encode_video(np.concatenate([video, *streams.values()])))
    img = np.asarray(encode_video(np.concatenate([video[:, :1]] + [v[:, :1] for v in streams.values()])))
    geometry_latents = {}
    for i, name in enumerate(list(streams)[1:]):
        geometry_latents[f"{name}_latents"] = lat[2 + i].astype(latent_dtype)
        geometry_latents[f"{name}_img_latent"] = img[2 + i].astype(latent_dtype)
    img = img[0]
    text = str(sample["text"])
    emb = np.asarray(embed_text(text), np.float32)
    for name, x in (("video latents", lat), ("image latent", img), ("text embedding", emb)):
        if not np.isfinite(x).all():
            raise ValueError(f"{name} of {source_name}/{episode}@{start} are not finite")
    return shards_lib.encode_record({
        "video_latents": lat[0].astype(latent_dtype),
        "control_video_latents": lat[1].astype(latent_dtype),
        "img_latent": img.astype(latent_dtype),
        **geometry_latents,
        "text_embedding": emb,
        "text": np.asarray(text, np.str_),
        "actions": sample["actions"], "has_actions": sample["has_actions"],
        "clip_id": sample["clip_id"], "episode": np.asarray(episode, np.str_),
        "start": np.asarray(start, np.int64), "source": np.asarray(source_name, np.str_),
    })


def preencode(source: ClipSource, out_dir: str, *, encode_video: VideoEncoder,
              render_control: ControlRenderer, embed_text: TextEmbedder,
              render_geometry: GeometryRenderer | None = None,
              cfg: PreencodeConfig = PreencodeConfig()) -> dict:
    """Encode this worker's shards of `source` into `out_dir`; returns a summary dict.
    `render_geometry`: also store the clip's depth and flow latents (RynnWorld-4D)."""
    refs = source.index()
    if not refs:
        raise errors.InputError(f"{source.root}: no usable {source.name} clips (see the warnings above)",
                                fix="check --root, --source and --frames")
    fingerprint = index_fingerprint(source, render_geometry is not None)
    fp_path = os.path.join(out_dir, f"{source.name}.index.json")
    total = max(1, math.ceil(len(refs) / cfg.records_per_shard))
    mine = [(s, os.path.join(out_dir, shards_lib.shard_name(source.name, s, total)))
            for s in range(cfg.worker, total, cfg.num_workers)]
    todo = [(s, path) for s, path in mine if not os.path.exists(path)]
    check_prompts(source, [r for s, _ in todo for r in refs[s * cfg.records_per_shard:(s + 1) * cfg.records_per_shard]],
                  embed_text)
    recorded = None
    if os.path.exists(fp_path):
        with open(fp_path) as f:
            recorded = json.load(f)["fingerprint"]
        if recorded != fingerprint and shards_lib.list_shards(out_dir, source.name):
            raise errors.InputError(f"--out {out_dir}: was encoded from a different clip index (files, "
                                    f"clip settings or --geometry changed)", fix="use a new output directory")
    os.makedirs(out_dir, exist_ok=True)
    if recorded != fingerprint:  # new, or replacing the index of a run that wrote no shard
        _write_json(fp_path, {"fingerprint": fingerprint, "num_clips": len(refs),
                              "clip_config": dataclasses.asdict(source.cfg)})
    done, written, skipped_clips = [p for _, p in mine if os.path.exists(p)], [], 0
    bar = tqdm(total=sum(len(refs[s * cfg.records_per_shard:(s + 1) * cfg.records_per_shard]) for s, _ in todo),
               desc=f"preencode {source.name}", unit="clip", disable=not todo)
    for s, path in todo:
        if os.path.exists(path + ".tmp"):  # this worker's shard, cut by a killed run
            os.remove(path + ".tmp")
        chunk = refs[s * cfg.records_per_shard:(s + 1) * cfg.records_per_shard]

        def records(chunk=chunk):
            nonlocal skipped_clips
            for ref in chunk:
                sample = source.load_or_none(ref)
                bar.update()
                if sample is None:
                    skipped_clips += 1
                    continue
                try:
                    yield encode_clip(sample, source.name, ref.episode, ref.start,
                                      encode_video=encode_video, render_control=render_control,
                                      embed_text=embed_text, latent_dtype=cfg.latent_dtype,
                                      render_geometry=render_geometry, episode_dir=source.path(ref.episode))
                except DataError as e:  # an episode without (whole) depth/flow renders
                    handle(e, source.strict)
                    skipped_clips += 1

        n = shards_lib.write_shard(path, records())
        written.append(path)
        log.info("wrote %s (%d clips)", path, n)
    bar.close()
    summary = {"source": source.name, "num_clips": len(refs), "num_shards": total,
               "written": len(written), "already_done": len(done), "skipped_clips": skipped_clips,
               "skip_reasons": dict(SKIPPED.counts)}
    _write_json(os.path.join(out_dir, f"{source.name}.worker{cfg.worker}.json"), summary)
    return summary


def check_prompts(source: ClipSource, refs: Sequence, embed_text: TextEmbedder) -> None:
    """Before anything is encoded: every prompt the source can name cheaply (`ClipSource.prompt`)
    has an embedding in `embed_text`'s directory (a `TextEmbeddingStore` that must not miss)."""
    if not isinstance(embed_text, TextEmbeddingStore) or embed_text.missing != "error":
        return
    prompts = set()
    for ref in refs:
        try:
            prompt = source.prompt(ref)
        except Exception:  # noqa: BLE001 -- an unreadable episode is the loader's to report and skip
            continue
        if prompt is not None:
            prompts.add(prompt)
    missing = sorted(p for p in prompts if not os.path.exists(embed_text.path(p) or ""))
    if missing:
        raise errors.MissingFileError(
            f"--text-embeddings {embed_text.directory}: no embedding for {len(missing)} of {len(prompts)} prompts, "
            f"e.g. {missing[0]!r} (expected {embed_text.path(missing[0])})",
            fix="add them (data/README.md) or pass --allow-missing-text")


def lazy(factory: Callable[[], VideoEncoder]) -> VideoEncoder:
    """An encoder built at its first call: the checks run before the VAE is loaded and compiled."""
    built: list[VideoEncoder] = []

    def encode(video: np.ndarray) -> np.ndarray:
        if not built:
            built.append(factory())
        return built[0](video)
    return encode


def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"  # workers sharing the output directory never share a tmp
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# ---- default encoders (the real models) ------------------------------------------------------------


def vae_encoder(vae: str) -> VideoEncoder:
    """Our Flax Wan2.2 VAE as a jitted encoder. `vae`: a converted checkpoint directory, an
    official/diffusers weight file, or "tiny" (random tiny VAE for smoke runs; meaningless latents)."""
    import jax
    from flax import nnx

    from rynn_jax import converted_weights
    from rynn_jax.models import vae as vae_lib
    from rynn_jax.models import vae_weights

    if vae == "tiny":
        model = vae_lib.init_vae(vae_lib.WanVAEConfig.tiny())
    elif converted_weights.is_converted_dir(vae):
        vcfg = converted_weights.load_config(vae, vae_lib.WanVAEConfig)
        model = vae_lib.vae_from_params(
            vcfg, converted_weights.restore_params(vae, vae_weights.abstract_params(vcfg)))
    else:
        model = vae_weights.load_vae(vae)
    graphdef, params = nnx.split(model)
    fn = jax.jit(lambda p, x: vae_lib.encode(graphdef, p, x))
    return lambda video: np.asarray(fn(params, video))


def skeleton_renderer(height: int, width: int, fps: float) -> ControlRenderer:
    """The project's depth-aware skeleton renderer (rynn_jax.render) for a clip's hands."""
    from rynn_jax.render import rasterize

    rcfg = rasterize.RenderConfig(width=width, height=height, fps=int(round(fps)))

    def render(sample: dict) -> np.ndarray:
        return np.asarray(rasterize.render_video(rcfg, sample["joints_cam"], sample["elbows_cam"],
                                                 sample["intrinsics"], sample["valid"]))
    return render


class TextEmbeddingStore:
    """Prompt → embedding from `<dir>/<sha256(prompt)>.safetensors` (the released code's
    prompt-embedding cache naming). A missing file is an error unless missing="empty", which
    stores a zero-length embedding (all-zero context, see rynn_jax.text)."""

    def __init__(self, directory: str | None, missing: str = "error", text_dim: int = 4096,
                 text_len: int = 512):
        if missing not in ("error", "empty"):
            raise ValueError(f"missing must be 'error' or 'empty', got {missing!r}")
        self.directory, self.missing = directory, missing
        self.text_dim, self.text_len = text_dim, text_len  # the DiT never sees more than text_len

    def path(self, text: str) -> str | None:
        if self.directory is None:
            return None
        return os.path.join(self.directory, hashlib.sha256(text.encode()).hexdigest() + ".safetensors")

    def __call__(self, text: str) -> np.ndarray:
        from rynn_jax.text import load_text_context

        path = self.path(text)
        if path is None or not os.path.exists(path):
            if self.missing == "error":
                raise errors.MissingFileError(f"no text embedding for {text!r} (expected {path})",
                                              fix="add it (data/README.md) or pass --allow-missing-text")
            return np.zeros((0, self.text_dim), np.float32)
        emb = load_text_context(path, text_len=self.text_len, text_dim=self.text_dim)
        nonzero = np.flatnonzero(np.abs(emb).sum(-1))
        return emb[: (nonzero[-1] + 1) if nonzero.size else 0]


def geometry_renderer(height: int, width: int) -> GeometryRenderer:
    """The episode's exact depth and flow (the sim's depth.npz / flow.npz) as the clip's videos."""
    from rynn_jax.data import geometry_video

    def render(episode_dir: str, sample: dict) -> dict[str, np.ndarray]:
        return geometry_video.clip_videos(episode_dir, sample["frame_index"], height, width)
    return render


# ---- CLI -------------------------------------------------------------------------------------------


def make_source(kind: str, root: str, clip_cfg: ClipConfig, strict: bool) -> ClipSource:
    from rynn_jax.data.egodex import EgoDexSource
    from rynn_jax.data.robot import RobotSource
    from rynn_jax.data.vitra import VitraSource

    if kind == "lerobot":
        from rynn_jax.data.formats.lerobot import LeRobotSource as cls
    elif kind == "rlds":  # TFDS loads only for this source
        from rynn_jax.data.formats.rlds import RldsSource as cls
    else:
        cls = {"egodex": EgoDexSource, "vitra": VitraSource, "robot": RobotSource}[kind]
    return cls(root, clip_cfg, strict=strict)


DEFAULT_FRAMES = {"egodex": 81, "vitra": 25, "robot": 81, "lerobot": 81, "rlds": 81}


def main(argv: Sequence[str] | None = None) -> dict:
    p = errors.ArgumentParser(prog="python -m rynn_jax.data.preencode", description=__doc__)
    p.add_argument("--source", required=True, choices=sorted(DEFAULT_FRAMES))
    p.add_argument("--root", required=True, help="dataset root (see data/README.md)")
    p.add_argument("--out", required=True, help="output directory for the shards (created)")
    p.add_argument("--vae", default="tiny", help="converted Wan2.2 VAE directory, or 'tiny'")
    p.add_argument("--text-embeddings", default=None, help="directory of <sha256>.safetensors")
    p.add_argument("--allow-missing-text", action="store_true", help="store empty embeddings")
    p.add_argument("--frames", type=int, default=None, help="clip length, 1 + 4k (default per source: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(DEFAULT_FRAMES.items())) + ")")
    p.add_argument("--stride", type=int, default=None,
                   help="clip start spacing in frames (default: the clip length, no overlap)")
    p.add_argument("--height", type=int, default=480, help="clip height, a multiple of 32")
    p.add_argument("--width", type=int, default=832, help="clip width, a multiple of 32")
    p.add_argument("--text-dim", type=int, default=4096, help="embedding width (umT5-XXL: 4096)")
    p.add_argument("--text-len", type=int, default=512, help="context slots the DiT reads")
    p.add_argument("--records-per-shard", type=int, default=64)
    p.add_argument("--worker", type=int, default=0, help="this worker's number ...")
    p.add_argument("--num-workers", type=int, default=1, help="... of this many")
    p.add_argument("--strict", action="store_true", help="stop at the first bad file")
    p.add_argument("--geometry", action="store_true",
                   help="also store depth and flow latents (RynnWorld-4D; robot episodes with depth.npz/flow.npz)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    frames = a.frames or DEFAULT_FRAMES[a.source]
    # Flags and paths first (no model is built before every cheap check has passed).
    if frames < 1 or (frames - 1) % 4:
        raise errors.UsageError(f"--frames {frames}: must be 1 + 4k (the VAE's temporal stride)")
    if a.height < 32 or a.width < 32 or a.height % 32 or a.width % 32:
        raise errors.UsageError(f"--height {a.height} / --width {a.width}: must be multiples of 32 (the VAE's 16x "
                                "downsampling times the DiT's 2x2 patches)")
    if a.records_per_shard < 1 or not 0 <= a.worker < a.num_workers:
        raise errors.UsageError(f"--records-per-shard {a.records_per_shard}, --worker {a.worker} of "
                                f"--num-workers {a.num_workers}: need ≥ 1 and 0 ≤ worker < num-workers")
    errors.existing(a.root, "--root", kind="directory")
    if a.vae != "tiny":
        errors.existing(a.vae, "--vae")
    if a.text_embeddings is not None:
        errors.existing(a.text_embeddings, "--text-embeddings", kind="directory")
    elif not a.allow_missing_text:
        raise errors.UsageError("--text-embeddings: not given, and every clip needs its prompt's embedding",
                                fix="give --text-embeddings DIR (data/README.md) or --allow-missing-text")
    errors.writable_dir(a.out, "--out")
    if a.stride is not None and a.stride < 1:
        raise errors.UsageError(f"--stride {a.stride}: must be ≥ 1")
    if a.geometry and a.source != "robot":
        raise errors.UsageError(f"--geometry with --source {a.source}: only robot episodes (the synthetic "
                                "world's) carry exact depth and flow")
    clip_cfg = ClipConfig(num_frames=frames, height=a.height, width=a.width, stride=a.stride)
    source = make_source(a.source, a.root, clip_cfg, a.strict)
    summary = preencode(
        source, a.out, encode_video=lazy(lambda: vae_encoder(a.vae)),
        render_control=skeleton_renderer(a.height, a.width, clip_cfg.fps),
        embed_text=TextEmbeddingStore(a.text_embeddings, "empty" if a.allow_missing_text else "error",
                                      text_dim=a.text_dim, text_len=a.text_len),
        render_geometry=geometry_renderer(a.height, a.width) if a.geometry else None,
        cfg=PreencodeConfig(records_per_shard=a.records_per_shard, worker=a.worker,
                            num_workers=a.num_workers))
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(errors.run(main))
