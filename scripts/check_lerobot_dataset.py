"""Load a LeRobot v3 dataset with LeRobot's own `LeRobotDataset`, offline, and check random
samples against the files read directly (pyarrow for the rows, PyAV for the frames).

    HF_HUB_OFFLINE=1 python scripts/check_lerobot_dataset.py DIR [--samples 5] [--video-backend pyav]

Run it where `lerobot` (0.4.x, codebase v3.0) is installed — a separate environment is fine, it
imports nothing from rynn_jax. Exit status 0 when every sampled action, state and task string is
identical and every frame equals the directly decoded one within 2/255; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq


def decoded_frame(path: Path, frame: int) -> np.ndarray:
    """Frame `frame` of a video (counted from 0 in presentation order) as (H, W, 3) uint8."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        for f in c.decode(s):
            if int(round(float(f.pts * s.time_base) * float(s.average_rate))) == frame:
                return f.to_ndarray(format="rgb24")
    raise ValueError(f"{path}: no frame {frame}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--video-backend", default="pyav", help="pyav (torchcodec needs FFmpeg libraries)")
    a = p.parse_args()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(a.root)
    ds = LeRobotDataset(repo_id="local/" + root.name, root=root, video_backend=a.video_backend)
    info = json.loads((root / "meta/info.json").read_text())
    rows = pq.read_table(sorted((root / "data").glob("*/*.parquet"))).to_pylist()
    rows = {r["index"]: r for r in rows}
    episodes = pq.read_table(sorted((root / "meta/episodes").glob("*/*.parquet"))).to_pylist()
    cams = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    report, ok = [], True
    for i in np.random.default_rng(a.seed).choice(len(ds), size=min(a.samples, len(ds)), replace=False):
        i = int(i)
        item, row = ds[i], rows[i]
        ep = episodes[row["episode_index"]]
        entry = {"index": i, "episode": row["episode_index"], "frame": row["frame_index"], "task": item["task"]}
        for key in ("action", "observation.state"):
            entry[f"{key}_equal"] = bool(np.array_equal(item[key].numpy(), np.asarray(row[key], np.float32)))
            ok &= entry[f"{key}_equal"]
        ok &= item["task"] == ep["tasks"][0]
        for cam in cams:
            path = root / info["video_path"].format(video_key=cam, chunk_index=ep[f"videos/{cam}/chunk_index"],
                                                    file_index=ep[f"videos/{cam}/file_index"])
            want = decoded_frame(path, round(ep[f"videos/{cam}/from_timestamp"] * info["fps"]) + row["frame_index"])
            got = np.round(item[cam].numpy().transpose(1, 2, 0) * 255)
            err = float(np.abs(got - want).max())
            entry[f"{cam}_max_abs_diff"] = err
            ok &= err <= 2
        report.append(entry)
    print(json.dumps({"dataset": str(root), "frames": len(ds), "episodes": ds.num_episodes,
                      "cameras": cams, "samples": report, "ok": bool(ok)}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
