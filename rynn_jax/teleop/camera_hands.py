"""From an operator stream to what the two halves of digital teleoperation consume.

The world model needs both hands' joints in the head camera's frame (to render the skeleton
video); the IK needs the tracker poses. A recorded `rynn-teleop-stream/1` file holds trackers in
the tracking-world frame and each hand's 21 keypoints in its wrist tracker's frame, plus the head
camera's pose `T_world_camera` (4×4, OpenCV axes: x right, y down, z forward) in `meta`.
"""

from __future__ import annotations

import jax
import numpy as np

from rynn_jax import errors
from rynn_jax.kinematics import se3, streams, tracker
from rynn_jax.render import synthetic_hand_motion

WRIST = {"left": tracker.TRACKERS.index("left_wrist"), "right": tracker.TRACKERS.index("right_wrist")}
UPPER_ARM = {"left": tracker.TRACKERS.index("left_upper_arm"), "right": tracker.TRACKERS.index("right_upper_arm")}
CHEST = tracker.TRACKERS.index("chest")
# Compiled once per length: eager, its few dozen small ops cost ≈ 15 ms per call, which a live
# session pays at every 16 fps tick.
_tracker_poses = jax.jit(tracker.tracker_poses)


def camera_pose(stream: streams.Stream) -> np.ndarray:
    if "T_world_camera" not in stream.meta:
        raise ValueError("the stream's meta has no 'T_world_camera' (head camera pose); "
                         "it is needed to render the skeleton from the robot's viewpoint")
    pose = np.asarray(stream.meta["T_world_camera"], np.float64)
    if pose.shape != (4, 4) or not np.isfinite(pose).all():
        raise ValueError(f"T_world_camera must be a finite 4×4 matrix, got shape {pose.shape}")
    return pose


def video_times(stream: streams.Stream, num_frames: int) -> np.ndarray:
    """The (num_frames,) times of the video's frames at 16 fps from the stream's start; raises
    a UsageError (a ValueError) when the stream ends before the last one."""
    t = stream.span[0] + np.arange(num_frames) / streams.VIDEO_FPS
    if t[-1] > stream.span[1] + 1e-6:
        raise errors.UsageError(f"--frames {num_frames}: the stream covers {stream.span[1] - stream.span[0]:.2f} s, "
                                f"too short for {num_frames} frames at {streams.VIDEO_FPS:g} fps",
                                fix=f"use at most {int((stream.span[1] - stream.span[0]) * streams.VIDEO_FPS + 1e-6) + 1}")
    return t


def hands_in_camera(stream: streams.Stream, t_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joints (T, 2, 21, 3) and elbows (T, 2, 3) in the camera frame at times `t_out`, and a
    (T, 2, 22) validity mask (joints + elbow) for the renderer; lost samples are NaN/invalid."""
    rs = streams.resample(stream, t_out)
    cam_from_world = np.linalg.inv(camera_pose(stream))
    joints = np.full((len(t_out), 2, 21, 3), np.nan)
    elbows = np.full((len(t_out), 2, 3), np.nan)
    valid = np.zeros((len(t_out), 2, 22), bool)
    for h, side in enumerate(("left", "right")):
        world_from_wrist = np.asarray(_tracker_poses(rs["trackers"][:, WRIST[side]].astype(np.float32)),
                                      np.float64)
        kp_h = np.concatenate([rs["hands"][:, h], np.ones((len(t_out), 21, 1))], axis=-1)
        joints[:, h] = np.einsum("ij,tjk,tnk->tni", cam_from_world, world_from_wrist, kp_h)[..., :3]
        elbow_w = np.concatenate([rs["trackers"][:, UPPER_ARM[side], :3], np.ones((len(t_out), 1))], -1)
        elbows[:, h] = (elbow_w @ cam_from_world.T)[:, :3]
        ok_hand = rs["hands_fresh"][:, h] & rs["trackers_fresh"][:, WRIST[side]]
        valid[:, h, :21] = ok_hand[:, None]
        valid[:, h, 21] = rs["trackers_fresh"][:, UPPER_ARM[side]]
    return joints.astype(np.float32), elbows.astype(np.float32), valid


def _frame_from_hand(joints_21: np.ndarray, side: str) -> np.ndarray:
    """The wrist frame the hand retargeter expects (palm-frame axes, docs/kinematics.md): origin at
    the wrist, z toward the fingers (middle knuckle), thumb side toward −y on the left hand and +y
    on the right, x = y × z."""
    wrist, index, middle, pinky = joints_21[0], joints_21[5], joints_21[9], joints_21[17]
    z = middle - wrist
    z /= np.linalg.norm(z)
    y = (pinky - index) if side == "left" else (index - pinky)
    y -= z * (y @ z)
    y /= np.linalg.norm(y)
    rot = np.stack([np.cross(y, z), y, z], axis=1)
    return np.asarray(se3.make_pose(rot.astype(np.float32), wrist.astype(np.float32)), np.float64)


def synthetic_stream(num_frames: int, seed: int = 0, fps: float = streams.VIDEO_FPS,
                     tracker_hz: float = 120.0) -> streams.Stream:
    """An operator stream whose hands move as `render.synthetic_hand_motion` (the bundled sample).

    The head camera sits 1.45 m up at the tracking-world origin, looking forward (+y) and pitched
    down 40°, like the robot's head camera; the chest tracker is 0.3 m below and 0.1 m behind it,
    its axes those the tracker chain expects of the operator (x forward = world +y, y left, z up).
    """
    joints_cam, elbows_cam = synthetic_hand_motion(num_frames, seed=seed, fps=int(fps))
    pitch = np.deg2rad(40.0)
    # camera axes in world (z up): x = world x, z (forward) = +y tilted down, y = z × x.
    fwd = np.array([0.0, np.cos(pitch), -np.sin(pitch)])
    right = np.array([1.0, 0.0, 0.0])
    t_world_cam = np.eye(4)
    t_world_cam[:3, :3] = np.stack([right, np.cross(fwd, right), fwd], axis=1)
    t_world_cam[:3, 3] = [0.0, 0.0, 1.45]

    t_video = np.arange(num_frames) / fps
    t_trk = np.arange(0.0, t_video[-1] + 1e-9, 1.0 / tracker_hz)
    # Tracker clock is faster: interpolate the (smooth) synthetic camera-space motion onto it.
    interp = lambda a: np.stack([np.interp(t_trk, t_video, a[:, i]) for i in range(a.shape[1])], 1)  # noqa: E731
    poses = np.zeros((len(t_trk), 5, 7))
    hand_kp = np.zeros((num_frames, 2, 21, 3))
    for h, side in enumerate(("left", "right")):
        j_world = joints_cam[:, h].astype(np.float64) @ t_world_cam[:3, :3].T + t_world_cam[:3, 3]
        e_world = elbows_cam[:, h].astype(np.float64) @ t_world_cam[:3, :3].T + t_world_cam[:3, 3]
        frames = np.stack([_frame_from_hand(j, side) for j in j_world])
        hand_kp[:, h] = np.einsum("tji,tnj->tni", frames[:, :3, :3], j_world - frames[:, None, :3, 3])
        pq = np.asarray(se3.pos_quat_from_pose(frames.astype(np.float32)), np.float64)
        pq[:, 3:] *= np.sign(pq[:, 3:4] + 1e-12)  # one hemisphere, so interpolation is smooth
        wrist = interp(pq)
        wrist[:, 3:] /= np.linalg.norm(wrist[:, 3:], axis=1, keepdims=True)
        poses[:, WRIST[side]] = wrist
        poses[:, UPPER_ARM[side], :3] = interp(e_world)
        poses[:, UPPER_ARM[side], 3:] = wrist[:, 3:]
    # Yaw +90°: with an identity chest the operator's forward (+y) became the robot's left and
    # the right arm was sent across the body into its limits.
    poses[:, CHEST] = [0.0, -0.1, 1.15, np.cos(np.pi / 4), 0.0, 0.0, np.sin(np.pi / 4)]
    return streams.Stream(
        tracker_t=t_trk, tracker_pose=poses, tracker_valid=np.ones((len(t_trk), 5), bool),
        hand_t=t_video, hand_keypoints=hand_kp.astype(np.float32),
        hand_valid=np.ones((num_frames, 2), bool),
        meta={"T_world_camera": t_world_cam.tolist(), "source": "rynn_jax.teleop.camera_hands.synthetic_stream",
              "seed": seed})
