"""A live session saved as a robot episode, with `serve.py generate`'s writer (`generate.write_episode`).

Frames go to raw files on disk as blocks arrive (memory stays flat however long the session), the
per-frame arrays (poses, commands) stay in memory; `finish` writes the episode atomically and
refreshes the folder's `action_stats.json`, so the record directory is a training source as it is.
The episode's frames are the generated ones, one per 16 fps tick that went through the model
(skipped ticks are not in it; held ones repeat the pose), its timestamps that clock from the first.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from rynn_jax.kinematics import layout, streams
from rynn_jax.live.world import Block
from rynn_jax.sim.robot_shards import write_action_stats
from rynn_jax.teleop.generate import Prepared, write_episode


class Recorder:
    def __init__(self, root: Path, name: str, image_hw3: np.ndarray, prompt: str, context: np.ndarray,
                 meta: dict, max_frames: int):
        self.directory, self.image, self.prompt, self.context = root / name, image_hw3, prompt, context
        self.meta, self.max_frames = meta, max_frames
        root.mkdir(parents=True, exist_ok=True)
        self._scratch = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        self._files = {k: open(self._scratch / k, "wb") for k in ("video", "skeleton")}
        self._ticks: list = []
        self.held = 0

    @property
    def frames(self) -> int:
        return len(self._ticks)

    @property
    def full(self) -> bool:
        return self.frames >= self.max_frames

    def add(self, block: Block) -> None:
        n = min(len(block.ticks), self.max_frames - self.frames)
        self._files["video"].write(np.ascontiguousarray(block.video[:n]).tobytes())
        self._files["skeleton"].write(np.ascontiguousarray(block.skeleton[:n]).tobytes())
        self._ticks += block.ticks[:n]
        self.held += min(block.held, n)

    def finish(self, stream: streams.Stream, extra_meta: dict) -> Path | None:
        """Write the episode (nothing when no frame was generated); returns its directory."""
        for f in self._files.values():
            f.close()
        try:
            n = self.frames
            if n == 0 or len(stream.tracker_t) == 0:
                return None
            h, w = self.image.shape[:2]
            video, skeleton = (np.memmap(self._scratch / k, np.uint8, "r", shape=(n, h, w, 3))
                               for k in ("video", "skeleton"))
            ticks = self._ticks
            t = ticks[0].t + np.arange(n) / streams.VIDEO_FPS
            ep = Prepared(self.directory.name, stream, self.image, skeleton, np.stack([k.joints for k in ticks]),
                          np.stack([k.elbows for k in ticks]), np.stack([k.valid for k in ticks]),
                          np.stack([k.action for k in ticks]), self.prompt, self.context, t,
                          np.stack([k.ik_pos_err for k in ticks]))
            meta = {**self.meta, "action_names": list(layout.ACTION_NAMES), "frames_held": self.held, **extra_meta}
            write_episode(ep, video, self.directory, meta)
            write_action_stats(self.directory.parent)
            return self.directory
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
