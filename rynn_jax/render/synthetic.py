"""Deterministic synthetic two-hand motion in camera space (demo samples, previews, benchmarks).

Egocentric view in the OpenCV camera frame (x right, y down, z forward, metres): both hands
reach forward over a table seen by a head camera pitched 40° down, palms down (backs towards the
camera), wrists at z ≈ 0.42-0.58 m (fingertips up to ≈ 0.7 m); wrists drift on slow sinusoids,
the hands yaw and roll a little, and the fingers curl and open in a wave (a cycle every ~2-3 s).
The elbows sit 0.26 m behind, below and outside the wrists, so the forearms enter from the
bottom of the image. Bone lengths are constant over time (adult hand proportions).
Same (T, seed, fps) → bit-identical output, and a shorter clip is a prefix of a longer one.
"""

from __future__ import annotations

import numpy as np

from rynn_jax.render import skeleton_style as sk

# Finger MCP positions in the hand frame, (along fingers f, towards the thumb s), metres.
_MCP_FS = np.array([[0.095, 0.025], [0.100, 0.003], [0.093, -0.017], [0.085, -0.036]])
_PHALANX_LEN = np.array([[0.043, 0.025, 0.021],  # index: MCP→PIP→DIP→tip
                         [0.047, 0.029, 0.022],  # middle
                         [0.044, 0.027, 0.022],  # ring
                         [0.034, 0.020, 0.019]])  # pinky
_THUMB_LEN = np.array([0.042, 0.032, 0.027])  # CMC→MCP→IP→tip
_FLEX_RAD = np.array([1.2, 1.4, 0.9])  # per-joint flexion at full curl (a loose fist)
_SPLAY = np.array([0.12, 0.02, -0.08, -0.18])  # sideways fan of an open hand
FOREARM_LEN_M = 0.26
# World directions in the camera frame of a head camera pitched 40° down.
_PITCH = np.deg2rad(40.0)
_X = np.array([1.0, 0.0, 0.0])
_DOWN = np.array([0.0, np.cos(_PITCH), np.sin(_PITCH)])
_FORWARD = np.array([0.0, -np.sin(_PITCH), np.cos(_PITCH)])


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _rotate(v: np.ndarray, axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """Rodrigues rotation of v [..., 3] about unit axis [..., 3] by angle [...]."""
    c, s = np.cos(angle)[..., None], np.sin(angle)[..., None]
    return v * c + np.cross(axis, v) * s + axis * np.sum(axis * v, -1, keepdims=True) * (1 - c)


def _hand(wrist_t3, f_t3, n_t3, s_t3, curl_t5) -> np.ndarray:
    """21 joints [T, 21, 3] from the wrist, the hand frame (f fingers, n palm normal, s thumb
    side) and per-finger curls in [0, 1] (thumb first)."""
    T = wrist_t3.shape[0]
    joints = np.zeros((T, sk.NUM_HAND_JOINTS, 3))
    joints[:, 0] = wrist_t3
    for k in range(4):  # index, middle, ring, pinky
        c = curl_t5[:, k + 1, None]
        base = wrist_t3 + _MCP_FS[k, 0] * f_t3 + _MCP_FS[k, 1] * s_t3
        f_dir = _unit(f_t3 + (_SPLAY[k] * (1 - c)) * s_t3)
        p, angle = base, np.zeros(T)
        joints[:, 5 + 4 * k] = base
        for j in range(3):
            angle = angle + _FLEX_RAD[j] * c[:, 0]
            d = np.cos(angle)[:, None] * f_dir + np.sin(angle)[:, None] * n_t3
            p = p + _PHALANX_LEN[k, j] * d
            joints[:, 6 + 4 * k + j] = p
    c = curl_t5[:, 0, None]
    open_dir = _unit(0.55 * f_t3 + 0.75 * s_t3 + 0.3 * n_t3)
    closed_dir = _unit(0.6 * f_t3 - 0.3 * s_t3 + 0.7 * n_t3)
    p = wrist_t3 + 0.025 * f_t3 + 0.025 * s_t3 + 0.01 * n_t3  # CMC
    joints[:, 1] = p
    for j, w in enumerate((0.3, 0.6, 0.9)):
        p = p + _THUMB_LEN[j] * _unit((1 - w * c) * open_dir + w * c * closed_dir)
        joints[:, 2 + j] = p
    return joints


def synthetic_hand_motion(T: int, seed: int = 0, fps: float = 16.0
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Plausible two-hand motion: (joints [T, 2, 21, 3], elbows [T, 2, 3]) float32, camera frame.

    Hand 0 is the left hand, hand 1 the right; MediaPipe joint order (module docstring).
    """
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    rng = np.random.default_rng(seed)
    t = np.arange(T) / fps
    joints, elbows = [], []
    for side in (-1.0, 1.0):  # left, right
        ph = rng.uniform(0, 2 * np.pi, size=8)
        fm = rng.uniform(0.8, 1.25, size=3)
        wave = lambda hz, amp, p: amp * np.sin(2 * np.pi * hz * t + p)
        wrist = np.stack([side * 0.12 + wave(0.23 * fm[0], 0.04, ph[0]),
                          0.07 + wave(0.19 * fm[1], 0.025, ph[1]),
                          0.50 + wave(0.15 * fm[2], 0.08, ph[2])], axis=-1)
        # Hand frame in world directions (palm down, fingers forward, a little inwards).
        f = _unit(np.broadcast_to(-side * 0.3 * _X + _FORWARD, (T, 3)))
        n = _unit(_DOWN - np.sum(_DOWN * f, -1, keepdims=True) * f)
        yaw, roll = wave(0.17, 0.25, ph[3]), wave(0.21, 0.3, ph[4])
        f = _rotate(f, n, yaw)
        n = _rotate(n, f, side * roll)
        s = -side * np.cross(n, f)  # thumb towards the body midline (palm-down hands)
        finger_phase = ph[5] + 0.6 * np.arange(5)
        cycle_hz = 0.35 * rng.uniform(0.85, 1.15)
        curl = 0.05 + 0.8 * (0.5 - 0.5 * np.cos(2 * np.pi * cycle_hz * t[:, None] + finger_phase))
        joints.append(_hand(wrist, f, n, s, curl))
        to_elbow = _unit(side * 0.35 * _X + 0.5 * _DOWN - 0.8 * _FORWARD)
        elbows.append(wrist + FOREARM_LEN_M * to_elbow)
    return (np.stack(joints, axis=1).astype(np.float32),
            np.stack(elbows, axis=1).astype(np.float32))
