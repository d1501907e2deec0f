"""The live server's WebSocket messages: parsing and checking what clients send, packing what they get.

Client → server (docs/LIVE.md has the full schema):
  text   {"type": "start", "schema": "rynn-teleop-stream/1", ...}   once, first
  text   {"type": "frame", "t": s, "tracker_pose": [5][7], ...}   one operator sample
  binary `FRAME_DTYPE`, 656 bytes                                  the same sample, packed
  text   {"type": "stop"}                                          end the session (recording saved)
Server → client:
  text   {"type": "ready" | "admitted" | "joints" | "block" | "stats" | "error" | "saved", ...}
  binary `FRAME_HEADER` + payload: one generated ("G"), skeleton ("S") or MuJoCo replay ("M") frame

Every check fails with a `ProtocolError` (a one-line reason and a short code) before anything of
the session changes, so the server answers that client and goes on.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import math
import struct
from typing import Any, Literal

import numpy as np

from rynn_jax.kinematics import streams

SCHEMA = streams.FORMAT  # operator frames: one sample of each of the stream file's arrays
FRAME_FORMATS = ("jpeg", "webp", "raw", "none")  # how generated (and skeleton) frames are sent
FORMAT_CODE = {"raw": 0, "jpeg": 1, "webp": 2}
SEED_MAX = 2**31 - 1  # sim seeds

# The binary operator frame, little-endian, no padding: kind b"F", version 1, validity bit masks
# (bit k = tracker k / hand k), the time, then the stream file's arrays in float32.
FRAME_DTYPE = np.dtype([("kind", "u1"), ("version", "u1"), ("tracker_valid", "u1"), ("hand_valid", "u1"),
                        ("t", "<f8"), ("tracker_pose", "<f4", (5, 7)), ("hand_keypoints", "<f4", (2, 21, 3))])
FRAME_KIND, FRAME_VERSION = ord("F"), 1
# A generated ("G"), skeleton ("S") or MuJoCo replay ("M") frame: kind, format (FORMAT_CODE), height,
# width, 0, the frame's index (G, S: in the session's video; M: the tick's on the 16 fps clock), the
# input time it answers (seconds, the client's clock).
FRAME_HEADER = struct.Struct("<BBHHHId")


class ProtocolError(ValueError):
    """A client message that is refused; `code` names the kind (docs/LIVE.md)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Frame:
    """One operator sample: the arrays of `streams.Stream` at one time `t`."""
    t: float
    tracker_pose: np.ndarray  # (5, 7) float64, [x, y, z, qw, qx, qy, qz]
    tracker_valid: np.ndarray  # (5,) bool
    hand_keypoints: np.ndarray  # (2, 21, 3) float64, each hand in its wrist frame
    hand_valid: np.ndarray  # (2,) bool


@dataclasses.dataclass(frozen=True)
class SimRef:
    """A sim task to start from (`rynn_jax.sim.scenes.TASKS`; the name is checked by `live.sim_start`)."""
    task: str
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Start:
    prompt: str = ""
    image: np.ndarray | None = None  # (H, W, 3) uint8 reference view; None: the bundled sample's
    camera: np.ndarray | None = None  # (4, 4) T_world_camera; None: the bundled sample's
    frames: Literal["jpeg", "webp", "raw", "none"] = "jpeg"
    skeleton: bool = False  # also send the skeleton frames that drove the model
    record: bool = False  # save the session as a robot episode when it ends
    name: str | None = None  # the episode's directory name (default: time and session id)
    sim: SimRef | None = None  # start from a sim task's view, camera and prompt instead of image / camera
    replay: bool = False  # (sim sessions) also send the sim robot replaying the joint commands ("M" frames)


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


def _reject_constant(name: str) -> None:
    raise ProtocolError("non_finite", f"{name} is not allowed in a message (numbers must be finite)")


def parse_text(text: str) -> Start | Frame | Stop:
    try:
        msg = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ProtocolError("bad_json", f"not JSON: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_message", 'a message must be a JSON object with a "type"')
    kind = msg["type"]
    if kind == "frame":
        return _frame(msg)
    if kind == "start":
        return _start(msg)
    if kind == "stop":
        return Stop()
    raise ProtocolError("bad_message", f'unknown message type {kind!r} (start, frame, stop)')


def _array(msg: dict, key: str, shape: tuple[int, ...], dtype=np.float64, default: Any = None) -> np.ndarray:
    if key not in msg:
        if default is not None:
            return np.full(shape, default, dtype)
        raise ProtocolError("bad_frame", f"frame has no {key!r}")
    try:
        a = np.asarray(msg[key], dtype)
    except (TypeError, ValueError):
        raise ProtocolError("bad_frame", f"{key} must be numbers of shape {list(shape)}") from None
    if a.shape != shape:
        raise ProtocolError("bad_frame", f"{key} must have shape {list(shape)}, got {list(a.shape)}")
    if dtype is not bool and not np.isfinite(a).all():
        raise ProtocolError("non_finite", f"{key} has NaN or infinite values (mark lost samples with the "
                            f"valid flags instead)")
    return a


def _frame(msg: dict) -> Frame:
    t = msg.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ProtocolError("bad_frame", "frame has no number 't' (seconds)")
    if not math.isfinite(t):
        raise ProtocolError("non_finite", "t is not finite")
    for key in ("tracker_valid", "hand_valid"):
        if key in msg and not (isinstance(msg[key], list) and all(isinstance(v, bool) for v in msg[key])):
            raise ProtocolError("bad_frame", f"{key} must be a list of true/false")
    return Frame(float(t), _array(msg, "tracker_pose", (5, 7)), _array(msg, "tracker_valid", (5,), bool, True),
                 _array(msg, "hand_keypoints", (2, 21, 3)), _array(msg, "hand_valid", (2,), bool, True))


def parse_binary(data: bytes) -> Frame:
    if len(data) != FRAME_DTYPE.itemsize:
        raise ProtocolError("bad_frame", f"a binary frame has {FRAME_DTYPE.itemsize} bytes, got {len(data)}")
    r = np.frombuffer(data, FRAME_DTYPE)[0]
    if r["kind"] != FRAME_KIND or r["version"] != FRAME_VERSION:
        raise ProtocolError("bad_frame", f"binary frame must start with b'F' and version {FRAME_VERSION}")
    arrays = {"t": r["t"], "tracker_pose": r["tracker_pose"], "hand_keypoints": r["hand_keypoints"]}
    for key, a in arrays.items():
        if not np.isfinite(a).all():
            raise ProtocolError("non_finite", f"{key} has NaN or infinite values")
    bits = lambda mask, n: np.asarray([(int(mask) >> k) & 1 for k in range(n)], bool)  # noqa: E731
    return Frame(float(r["t"]), r["tracker_pose"].astype(np.float64), bits(r["tracker_valid"], 5),
                 r["hand_keypoints"].astype(np.float64), bits(r["hand_valid"], 2))


def pack_frame(f: Frame) -> bytes:
    """The binary form of `f` (what `parse_binary` reads)."""
    r = np.zeros((), FRAME_DTYPE)
    r["kind"], r["version"], r["t"] = FRAME_KIND, FRAME_VERSION, f.t
    r["tracker_valid"] = sum(1 << k for k, v in enumerate(f.tracker_valid) if v)
    r["hand_valid"] = sum(1 << k for k, v in enumerate(f.hand_valid) if v)
    r["tracker_pose"], r["hand_keypoints"] = f.tracker_pose, f.hand_keypoints
    return r.tobytes()


def frames_at(stream: streams.Stream, hz: float) -> list[Frame]:
    """A recorded stream as live frames: both clocks resampled at `hz` over the stream's span
    (lost samples flagged invalid, with the held values)."""
    t0, t1 = stream.span
    rs = streams.resample(stream, streams.clock(t0, t1, hz))
    trk, hands = np.nan_to_num(rs["trackers"]), np.nan_to_num(rs["hands"])  # NaN only where flagged lost
    return [Frame(float(rs["t"][i]), trk[i], rs["trackers_fresh"][i], hands[i], rs["hands_fresh"][i])
            for i in range(len(rs["t"]))]


def frame_json(f: Frame) -> dict:
    return {"type": "frame", "t": f.t, "tracker_pose": f.tracker_pose.tolist(),
            "tracker_valid": f.tracker_valid.tolist(), "hand_keypoints": f.hand_keypoints.tolist(),
            "hand_valid": f.hand_valid.tolist()}


def _start(msg: dict) -> Start:
    if msg.get("schema") != SCHEMA:
        raise ProtocolError("bad_schema", f'start: "schema" must be {SCHEMA!r}, got {msg.get("schema")!r}')
    known = {"type", "schema", "prompt", "image", "T_world_camera", "frames", "skeleton", "record", "name", "sim",
             "replay"}
    if extra := sorted(set(msg) - known):
        raise ProtocolError("bad_start", f"start: unknown field(s) {', '.join(extra)}")
    prompt = msg.get("prompt", "")
    if not isinstance(prompt, str):
        raise ProtocolError("bad_start", "start: prompt must be a string")
    frames = msg.get("frames", "jpeg")
    if frames not in FRAME_FORMATS:
        raise ProtocolError("bad_start", f"start: frames must be one of {', '.join(FRAME_FORMATS)}, got {frames!r}")
    flags = {k: msg.get(k, False) for k in ("skeleton", "record", "replay")}
    if not all(isinstance(v, bool) for v in flags.values()):
        raise ProtocolError("bad_start", "start: skeleton, record and replay must be true or false")
    name = msg.get("name")
    if name is not None and (not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum()
                             or len(name) > 64):
        raise ProtocolError("bad_start", "start: name must be 1-64 letters, digits, '-' or '_'")
    camera = None
    if "T_world_camera" in msg:
        camera = _array(msg, "T_world_camera", (4, 4))
        if not np.allclose(camera[3], [0, 0, 0, 1]):
            raise ProtocolError("bad_start", "start: T_world_camera's last row must be [0, 0, 0, 1]")
    sim = _sim(msg["sim"]) if msg.get("sim") is not None else None
    if sim is not None and (camera is not None or msg.get("image") is not None):
        raise ProtocolError("bad_start", "start: a sim session starts from the task's own view and camera "
                                         "(no image, no T_world_camera)")
    if flags["replay"] and (sim is None or frames == "none"):
        raise ProtocolError("bad_start", 'start: replay needs a sim task and frames other than "none"')
    image = _image(msg["image"]) if msg.get("image") is not None else None
    return Start(prompt, image, camera, frames, flags["skeleton"], flags["record"], name, sim, flags["replay"])


def parse_seed(value: Any) -> int:
    """A sim seed: an integer in 0 … 2³¹ − 1 (a number, or its decimal text from a URL)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ProtocolError("bad_start", f"start: the sim seed must be an integer in 0..{SEED_MAX}, got {value!r}")
    return value


def _sim(value: Any) -> SimRef:
    if not isinstance(value, dict) or not isinstance(value.get("task"), str) or set(value) - {"task", "seed"}:
        raise ProtocolError("bad_start", 'start: sim must be {"task": name, "seed": integer}')
    return SimRef(value["task"], parse_seed(value.get("seed", 0)))


def _image(data: Any) -> np.ndarray:
    """A base64 PNG or JPEG (optionally a data: URL) → (H, W, 3) uint8."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, str):
        raise ProtocolError("bad_image", "start: image must be a base64 PNG or JPEG string")
    try:
        raw = base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data, validate=True)
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in ("PNG", "JPEG"):
                raise ProtocolError("bad_image", f"start: image must be PNG or JPEG, got {im.format}")
            return np.asarray(im.convert("RGB"))
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as e:
        if isinstance(e, ProtocolError):
            raise
        raise ProtocolError("bad_image", f"start: image is not a readable base64 PNG or JPEG ({e})") from None


def encode_frame(kind: Literal["G", "S", "M"], rgb_hw3: np.ndarray, fmt: str, index: int, t: float,
                 quality: int = 85) -> bytes:
    """One frame for the client: `FRAME_HEADER` then raw RGB bytes, a JPEG or a WebP."""
    h, w = rgb_hw3.shape[:2]
    if fmt == "raw":
        payload = np.ascontiguousarray(rgb_hw3, np.uint8).tobytes()
    else:
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(rgb_hw3).save(buf, format=fmt.upper(), quality=quality)
        payload = buf.getvalue()
    return FRAME_HEADER.pack(ord(kind), FORMAT_CODE[fmt], h, w, 0, index, t) + payload


def decode_frame(data: bytes) -> tuple[str, int, float, np.ndarray]:
    """(kind, index, input time, (H, W, 3) uint8) of an `encode_frame` message (clients, tests)."""
    kind, code, h, w, _, index, t = FRAME_HEADER.unpack_from(data)
    payload = data[FRAME_HEADER.size:]
    if code == FORMAT_CODE["raw"]:
        rgb = np.frombuffer(payload, np.uint8).reshape(h, w, 3)
    else:
        from PIL import Image

        rgb = np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))
    return chr(kind), index, t, rgb
