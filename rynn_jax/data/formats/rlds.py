"""RLDS (the TFDS episode format of Open-X): our robot-layout episodes written through a TFDS
`GeneratorBasedBuilder` into ArrayRecord shards (no TensorFlow import; TFRecord only where
TensorFlow is installed), and `RldsSource`, a `ClipSource` over any ArrayRecord RLDS dataset.

    <out>/rynn_robot/1.0.0/  dataset_info.json, features.json, metadata.json,
                             rynn_robot-train.array_record-0000i-of-0000n

One example per episode: `steps` (one per frame) with `observation/{image, skeleton_image, state,
hand_points, hand_valid, camera_intrinsics}`, `action`, `reward`, `discount`, `is_first`,
`is_last`, `is_terminal`, `language_instruction`; `episode_metadata/{file_path, episode_index}`.
Frames are JPEG (what Open-X datasets store); data/README.md has the full mapping. TFDS cuts the
shards by size, writes into an `incomplete.*` folder and renames it when done; our export builds
into a staging folder and swaps the finished version in, so `<out>` always holds a whole dataset.
A re-run with the same episodes and settings (recorded in metadata.json) does nothing.

Read back with TFDS alone: `tfds.builder_from_directory(<out>/rynn_robot/1.0.0).as_data_source("train")`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import shutil
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from rynn_jax import errors
from rynn_jax.data import clips as clips_lib
from rynn_jax.data import robot as robot_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.formats import episode as ep_lib
from rynn_jax.data.source import ClipSource, Sample, check_finite, empty_actions

NAME, VERSION = "rynn_robot", "1.0.0"
FILE_FORMATS = ("array_record", "tfrecord")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RldsExportConfig:
    jpeg_quality: int = 95  # frames are stored as JPEG, as Open-X datasets do
    file_format: str = "array_record"  # "tfrecord" needs TensorFlow (tf.data readers, Open-X loaders)


def _jpeg(img_hw3: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img_hw3).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class RynnRobot(tfds.core.GeneratorBasedBuilder):
    """Robot-layout episodes as RLDS (built by `export`; readers need only the written folder)."""

    VERSION = tfds.core.Version(VERSION)

    def __init__(self, *, episodes_root: str, infos: list[ep_lib.EpisodeInfo], cfg: RldsExportConfig,
                 stats: dict, **kw):
        self._root, self._infos, self._cfg, self._stats = episodes_root, infos, cfg, stats
        super().__init__(file_format=cfg.file_format, **kw)

    def _info(self) -> tfds.core.DatasetInfo:
        first = self._infos[0]
        obs = {"image": tfds.features.Image(shape=(*first.size, 3), encoding_format="jpeg",
                                            doc="Head camera RGB."),
               "state": tfds.features.Tensor(shape=(clips_lib.ACTION_DIM,), dtype=np.float32,
                                             doc="54-D joint positions [left arm 7 | left hand 20 | right arm 7 | right hand 20]."),
               }
        if all(e.skeleton_size for e in self._infos):
            obs["skeleton_image"] = tfds.features.Image(shape=(*first.skeleton_size, 3), encoding_format="jpeg",
                                                        doc="Depth-aware skeleton render of the operator's hands.")
        if all(e.hand_skeleton for e in self._infos):
            obs["hand_points"] = tfds.features.Tensor(
                shape=(2, sk.NUM_POINTS, 3), dtype=np.float32,
                doc="Hands (0 left, 1 right) × 21 MediaPipe joints + elbow, head-camera OpenCV frame, metres; untracked = 0.")
            obs["hand_valid"] = tfds.features.Tensor(shape=(2, sk.NUM_POINTS), dtype=np.bool_, doc="Tracked.")
            obs["camera_intrinsics"] = tfds.features.Tensor(shape=(3, 3), dtype=np.float32,
                                                            doc="Head camera K at the image size.")
        steps = tfds.features.Dataset({
            "observation": obs,
            "action": tfds.features.Tensor(shape=(clips_lib.ACTION_DIM,), dtype=np.float32,
                                           doc="54-D joint position command, same layout as the state."),
            "reward": tfds.features.Scalar(dtype=np.float32, doc="1 on the last step (a finished demonstration)."),
            "discount": tfds.features.Scalar(dtype=np.float32),
            "is_first": tfds.features.Scalar(dtype=np.bool_),
            "is_last": tfds.features.Scalar(dtype=np.bool_),
            "is_terminal": tfds.features.Scalar(dtype=np.bool_),
            "language_instruction": tfds.features.Text(),
        })
        return tfds.core.DatasetInfo(
            builder=self,
            description="Robot teleoperation episodes exported from the rynn-jax robot layout.",
            features=tfds.features.FeaturesDict({
                "steps": steps,
                "episode_metadata": {"file_path": tfds.features.Text(doc="Episode folder in the robot layout."),
                                     "episode_index": tfds.features.Scalar(dtype=np.int64)},
            }),
            metadata=tfds.core.MetadataDict(self._stats),
            disable_shuffling=True,  # records in episode order: record i is episode_index i
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        q = self._cfg.jpeg_quality
        for i, info in enumerate(self._infos):
            ep = ep_lib.read_episode(self._root, info.name)
            if len(ep) != info.length:
                raise DataError(os.path.join(self._root, info.name), "changed while exporting")
            n = len(ep)
            steps = []
            for t in range(n):
                obs = {"image": _jpeg(ep.video[t], q), "state": ep.state[t]}
                if ep.skeleton_video is not None and "skeleton_image" in self.info.features["steps"]["observation"]:
                    obs["skeleton_image"] = _jpeg(ep.skeleton_video[t], q)
                if "hand_points" in self.info.features["steps"]["observation"]:
                    obs |= {"hand_points": ep.hand_points[t], "hand_valid": ep.hand_valid[t],
                            "camera_intrinsics": ep.intrinsics}
                last = t == n - 1
                steps.append({"observation": obs, "action": ep.actions[t], "reward": float(last),
                              "discount": 1.0, "is_first": t == 0, "is_last": last, "is_terminal": last,
                              "language_instruction": ep.task})
            yield info.name, {"steps": steps, "episode_metadata": {"file_path": info.name, "episode_index": i}}


def check_file_format(file_format: str, flag: str = "--rlds-file-format") -> None:
    if file_format not in FILE_FORMATS:
        raise errors.UsageError(f"{flag} {file_format}: choose from {', '.join(FILE_FORMATS)}")
    if file_format == "tfrecord" and importlib.util.find_spec("tensorflow") is None:
        raise errors.UsageError(f"{flag} tfrecord: needs TensorFlow, which is not installed",
                                fix="pip install tensorflow-cpu, or use array_record")


def version_dir(out: str | os.PathLike[str]) -> Path:
    return Path(out) / NAME / VERSION


def export(root: str | os.PathLike[str], out: str | os.PathLike[str], cfg: RldsExportConfig = RldsExportConfig()
           ) -> dict:
    """Write the RLDS dataset `<out>/rynn_robot/1.0.0` from the robot-layout episodes under `root`
    (replacing an older one whole); returns a summary."""
    check_file_format(cfg.file_format, "file_format")
    root, out = os.fspath(root), Path(out)
    infos = ep_lib.survey(root)
    actions = np.concatenate([robot_lib.read_vectors(os.path.join(root, e.name, robot_lib.TIMESERIES_FILE),
                                                     robot_lib.ACTION_COLUMN, clips_lib.ACTION_DIM) for e in infos])
    meta = {"fps": infos[0].fps, "source_episodes": [[e.name, e.length] for e in infos],
            "settings": dataclasses.asdict(cfg),
            "action_stats": {"mean": actions.mean(0).tolist(), "std": actions.std(0).tolist(),
                             "q01": np.quantile(actions, 0.01, axis=0).tolist(),
                             "q99": np.quantile(actions, 0.99, axis=0).tolist()}}
    final = version_dir(out)
    summary = {"format": "rlds", "out": str(final), "episodes": len(infos), "frames": int(len(actions))}
    if (final / "dataset_info.json").exists():
        try:
            old = tfds.builder_from_directory(str(final)).info.metadata
            if old.get("source_episodes") == meta["source_episodes"] and old.get("settings") == meta["settings"]:
                return {**summary, "written": False}
        except Exception:  # noqa: BLE001 -- an unreadable old export is simply replaced
            pass
    stage = out / f".staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        builder = RynnRobot(episodes_root=root, infos=infos, cfg=cfg, stats=meta, data_dir=str(stage))
        builder.download_and_prepare()
        final.parent.mkdir(parents=True, exist_ok=True)
        old = final.with_name(final.name + f".old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(version_dir(stage), final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {**summary, "written": True}


# ---- import ----------------------------------------------------------------------------------------


class RldsSource(ClipSource):
    """Clips of an ArrayRecord RLDS dataset (ours, or any whose steps carry an image) in the sample
    schema of `clips`. `root`: the version folder (with dataset_info.json).

    `image_key`: the observation image that becomes `video`. Actions come from `action` when it is a
    54-D tensor; `actions=False` reads other robots' datasets without them. The skeleton comes from
    `observation/{hand_points, hand_valid, camera_intrinsics}` when present. `fps`: the steps' rate
    (ours record it in metadata.json; Open-X datasets do not, so give it). `action_norm` uses the
    metadata's action_stats. TFRecord datasets need TensorFlow to read; convert them to ArrayRecord
    (`tfds convert_format`) first.
    """

    name = "rlds"

    def __init__(self, root, cfg: ClipConfig = ClipConfig(num_frames=81), *, strict: bool = False,
                 action_norm: str | None = None, image_key: str = "image", split: str = "train",
                 fps: float | None = None, actions: bool = True):
        super().__init__(root, cfg, strict=strict)
        robot_lib.check_action_norm(action_norm)
        self.image_key, self.split, self.actions, self.action_norm = image_key, split, actions, action_norm
        info_path = self.path("dataset_info.json")
        if not os.path.isfile(info_path):
            raise DataError(info_path, "missing file", "not a TFDS dataset version folder")
        try:
            builder = tfds.builder_from_directory(self.root)
            info = builder.info
        except Exception as e:  # noqa: BLE001 -- TFDS raises many kinds for a damaged folder
            raise DataError(info_path, "unreadable TFDS dataset", f"{type(e).__name__}: {e}") from e
        fmt = str(getattr(info.file_format, "value", info.file_format))
        if fmt != "array_record":
            raise DataError(info_path, "not ArrayRecord", f"{fmt} shards need TensorFlow to read; convert them "
                            "with `tfds convert_format --out_file_format=array_record`")
        if split not in info.splits:
            raise DataError(info_path, "no such split", f"{split!r}; splits: {list(info.splits)}")
        steps = info.features["steps"]
        obs = steps["observation"]
        if image_key not in obs:
            raise DataError(info_path, "no such image", f"observation/{image_key}; has {list(obs.keys())}")
        if actions and getattr(steps["action"], "shape", None) != (clips_lib.ACTION_DIM,):
            raise DataError(info_path, "not our action layout",
                            f"action has shape {getattr(steps['action'], 'shape', None)}, not "
                            f"({clips_lib.ACTION_DIM},); read it with actions=False")
        self.fps = float(fps or info.metadata.get("fps", 0) if info.metadata else fps or 0)
        if self.fps <= 0:
            raise DataError(info_path, "unknown frame rate", "metadata.json has no fps; pass fps=")
        self.has_hands = all(k in obs for k in ("hand_points", "hand_valid", "camera_intrinsics"))
        self.size = tuple(obs[image_key].shape[:2])
        self.action_stats = None
        if action_norm:
            raw = (info.metadata or {}).get("action_stats", {})
            self.action_stats = robot_lib.action_stats(raw, action_norm, self.path("metadata.json"))
        self._shard_lengths = list(info.splits[split].shard_lengths)
        self.shards, self.num_episodes = self._check_shards(info.splits[split])
        self._data = None

    @staticmethod
    def _check_shards(split_info) -> tuple[list[str], int]:
        """Each shard is there and holds the records dataset_info.json counts (a cut ArrayRecord
        file opens with fewer, often 0); returns the shard paths and the episode count."""
        from array_record.python.array_record_module import ArrayRecordReader

        paths = [os.fspath(p) for p in split_info.filepaths]
        for path, want in zip(paths, split_info.shard_lengths):
            if not os.path.isfile(path):
                raise DataError(path, "missing file")
            try:
                reader = ArrayRecordReader(path)
                got = reader.num_records()
                reader.close()
            except Exception as e:  # noqa: BLE001 -- riegeli raises RuntimeError/ValueError/OSError
                raise DataError(path, "unreadable ArrayRecord shard", f"{type(e).__name__}: {e}") from e
            if got != int(want):
                raise DataError(path, "truncated or mismatched shard", f"{got} records, dataset_info.json says {want}")
        return paths, int(sum(int(n) for n in split_info.shard_lengths))

    def _shard_of(self, i: int) -> str:
        ends = np.cumsum([int(n) for n in self._shard_lengths])
        return self.shards[int(np.searchsorted(ends, i, side="right"))]

    def data(self):
        """The split as a TFDS data source (random access, decoded with NumPy; opened once per process)."""
        if self._data is None:
            try:
                self._data = tfds.builder_from_directory(self.root).as_data_source(split=self.split)
            except Exception as e:  # noqa: BLE001
                raise DataError(self.root, "unreadable ArrayRecord shards", f"{type(e).__name__}: {e}") from e
        return self._data

    def __getstate__(self):
        state = super().__getstate__()
        state["_data"] = None
        return state

    def episodes(self) -> list[str]:
        return [f"episode_{i:06d}" for i in range(self.num_episodes)]

    def _episode(self, episode: str) -> dict:
        i = int(episode.rsplit("_", 1)[1])
        data = self.data()
        try:
            return data[i]
        except Exception as e:  # noqa: BLE001 -- a damaged record: ArrayRecord/protobuf errors vary
            raise DataError(self._shard_of(i), "unreadable record", f"{episode}: {type(e).__name__}: {e}") from e

    def num_samples(self, episode: str) -> int:
        n = len(self._episode(episode)["steps"])
        if n == 0:
            raise DataError(self._shard_of(int(episode.rsplit("_", 1)[1])), "empty episode", episode)
        return clips_lib.resampled_length(n, self.fps, self.cfg.fps)

    def load(self, ref: ClipRef) -> Sample:
        cfg = self.cfg
        steps = self._episode(ref.episode)["steps"]
        shard = self._shard_of(int(ref.episode.rsplit("_", 1)[1]))
        idx = clips_lib.resample_indices(ref.start, cfg.num_frames, self.fps, cfg.fps)
        if idx[-1] >= len(steps):
            raise DataError(shard, "truncated episode", f"{ref.episode} has {len(steps)} steps")
        try:
            got = [steps[int(i)] for i in idx]
        except Exception as e:  # noqa: BLE001 -- a damaged image or tensor inside the record
            raise DataError(shard, "unreadable record", f"{ref.episode}: {type(e).__name__}: {e}") from e
        obs = [s["observation"] for s in got]
        text = got[0]["language_instruction"]
        out: Sample = {"frame_index": idx,
                       "text": clips_lib.text_array(text.decode() if isinstance(text, bytes) else str(text))}
        if self.actions:
            acts = check_finite(shard, "actions", np.stack([s["action"] for s in got]).astype(np.float32))
            out |= {"actions": robot_lib.normalize_actions(acts, self.action_stats, self.action_norm)
                    .astype(np.float32), "has_actions": np.asarray(True)}
        else:
            out |= empty_actions(cfg.num_frames)
        hands = (np.stack([o["hand_points"] for o in obs]).reshape(len(obs), -1).astype(np.float32),
                 np.stack([o["hand_valid"] for o in obs]).reshape(len(obs), -1).astype(np.float32),
                 np.asarray(obs[0]["camera_intrinsics"], np.float32)) if self.has_hands else (None, None, None)
        out |= ep_lib.skeleton_sample(shard, *hands, self.size, cfg, cfg.min_valid_fraction)
        out["video"] = video_lib.resize_crop(np.stack([o[self.image_key] for o in obs]), cfg.width, cfg.height)
        return out
