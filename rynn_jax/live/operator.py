"""One live operator on the host: per frame the IK's 54-D command, per 16 fps tick the skeleton pose.

    frame (t, trackers, hands) ─ streams.resample at t ─ retarget.step ─▶ 54-D command (tracker rate)
                               └ session.hands_in_camera at each video tick ≤ t ─▶ Tick ─▶ TickQueue

Both halves run the offline path's own functions on a window of the latest frames (a
`streams.Stream`), so a live session's commands and skeleton poses equal `retarget_stream` and
`hands_in_camera` of the same frames recorded as a file (as long as lost samples are not
followed by a valid one within `max_gap`: offline interpolates across such a gap, live cannot see
the future and holds). The first frame with all five trackers valid calibrates (as offline); before
it the robot holds its home pose.

With a camera in the robot frame (`robot_camera`: a sim task's head camera) the skeleton poses go
through the calibrated tracker chain instead (`hands_through_chain`, what a sim episode's skeleton
video shows); before calibration there is none (black frames).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import jax
import numpy as np

from rynn_jax.kinematics import layout, mjcf_model, retarget, streams
from rynn_jax.kinematics.chain_hands import chain_targets, hands_through_chain
from rynn_jax.live.protocol import Frame, ProtocolError
from rynn_jax.teleop.camera_hands import hands_in_camera, synthetic_stream

WINDOW_FRAMES = 32  # frames kept for resampling (≥ 2 ticks at 16 fps for trackers down to 16 Hz)

# One compiled program each, shared by every session (robot, calibration and state are arguments).
_ik_step = jax.jit(retarget.step, static_argnames="cfg")
_calibrated = jax.jit(retarget.calibrated, static_argnames="scale")


@dataclasses.dataclass(frozen=True)
class Kinematics:
    """What every operator's IK shares: the robot's arrays, its home state, the solver settings
    (`realtime_config`: warm-started, converging over a few tracker-rate steps) and the scale."""
    robot: retarget.Robot
    home: retarget.RetargetState
    cfg: retarget.RetargetConfig
    scale: float = 1.5

    @classmethod
    def build(cls, cfg: retarget.RetargetConfig | None = None, scale: float = 1.5) -> Kinematics:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            emb = mjcf_model.embodiment()
            return cls(retarget.robot_arrays(emb), retarget.initial_state(emb), cfg or retarget.realtime_config(), scale)

    def warm_up(self) -> None:
        """Compile the calibration and the IK step (an operator's first frames would wait for it)."""
        from rynn_jax.live.protocol import frames_at

        stream = synthetic_stream(2)
        op = Operator(self, np.asarray(stream.meta["T_world_camera"]), TickQueue(4))
        for f in frames_at(stream, streams.VIDEO_FPS):
            op.add(f)

    @property
    def home_action(self) -> np.ndarray:
        return np.asarray(layout.pack_action(self.home.arm_q_s7, self.home.hand_filt_s20), np.float32)


@dataclasses.dataclass(frozen=True)
class Tick:
    """The operator at one tick of the 16 fps video clock."""
    t: float  # the tick's time on the client's clock
    joints: np.ndarray  # (2, 21, 3) float32, hands in the head camera
    elbows: np.ndarray  # (2, 3) float32
    valid: np.ndarray  # (2, 22) bool
    action: np.ndarray  # (54,) float32, the command of the frame that completed the tick
    ik_pos_err: np.ndarray  # (2,) metres
    arrival: float  # time.monotonic() when that frame arrived


class TickQueue:
    """Ticks waiting for the world model, at most `maxlen` (the oldest fall out, counted as
    dropped): when the model is slower than the operator it skips to the newest poses."""

    def __init__(self, maxlen: int):
        self._q: collections.deque[Tick] = collections.deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, ticks: list[Tick]) -> None:
        with self._lock:
            self._q.extend(ticks)
            while len(self._q) > self._maxlen:
                self._q.popleft()
                self.dropped += 1

    def __len__(self) -> int:
        return len(self._q)

    def take(self, n: int) -> list[Tick]:
        """The newest `n` ticks (fewer if not there), oldest first; older ones are dropped."""
        with self._lock:
            while len(self._q) > n:
                self._q.popleft()
                self.dropped += 1
            out = list(self._q)
            self._q.clear()
        return out


class Operator:
    def __init__(self, kin: Kinematics, camera_44: np.ndarray, queue: TickQueue,
                 robot_camera_44: np.ndarray | None = None):
        """`camera_44`: the head camera in the tracking world (the stream's `T_world_camera`);
        `robot_camera_44`: the head camera in the robot frame, when known (then the skeleton goes
        through the tracker chain)."""
        self.kin, self.camera, self.queue = kin, np.asarray(camera_44, np.float64), queue
        self.robot_camera = None if robot_camera_44 is None else np.asarray(robot_camera_44, np.float64)
        self.window: collections.deque[Frame] = collections.deque(maxlen=WINDOW_FRAMES)
        self.state, self.calib = kin.home, None
        self.t0: float | None = None
        self.ticks_made = 0
        self.frames: list[Frame] = []  # every accepted frame (kept only while recording)
        self.keep_frames = False

    def add(self, f: Frame) -> tuple[dict, list[Tick]]:
        """Take one frame: (the joints message, the video ticks it completed, also queued)."""
        if self.window and not f.t > self.window[-1].t:
            raise ProtocolError("bad_time", f"t must increase: {f.t!r} after {self.window[-1].t!r}")
        arrival = time.monotonic()
        self.window.append(f)
        if self.keep_frames:
            self.frames.append(f)
        window = stream_of(list(self.window), self.camera)
        rs = streams.resample(window, np.asarray([f.t]))
        t = time.perf_counter()
        with jax.default_device(jax.local_devices(backend="cpu")[0]):  # beside the world model, not behind it
            if self.calib is None and rs["trackers_fresh"][0].all():
                self.calib = _calibrated(self.kin.robot, self.kin.home, rs["trackers"][0].astype(np.float32),
                                         scale=self.kin.scale)
            if self.calib is None:
                action, pos_err = self.kin.home_action, np.zeros(2, np.float32)
            else:
                self.state, action, info = _ik_step(self.kin.robot, self.calib, self.state,
                                                    rs["trackers"][0].astype(np.float32),
                                                    rs["hands"][0].astype(np.float32), cfg=self.kin.cfg)
                action, pos_err = np.asarray(action), np.asarray(info.ik.pos_err)
        ik_ms = 1e3 * (time.perf_counter() - t)
        msg = {"type": "joints", "t": f.t, "action": action.tolist(), "calibrated": self.calib is not None,
               "tracker_fresh": rs["trackers_fresh"][0].tolist(), "hand_fresh": rs["hands_fresh"][0].tolist(),
               "ik_ms": round(ik_ms, 3)}
        ticks = self._ticks(window, f.t, action, pos_err, arrival)
        self.queue.put(ticks)
        return msg, ticks

    def _ticks(self, window: streams.Stream, t: float, action: np.ndarray, pos_err: np.ndarray,
               arrival: float) -> list[Tick]:
        """The video ticks in (last tick, t], on the clock t0 + k / 16 (`session.video_times`'s)."""
        if self.t0 is None:
            self.t0 = t
        k = np.arange(self.ticks_made, int(np.floor((t - self.t0) * streams.VIDEO_FPS + 1e-9)) + 1)
        if not len(k):
            return []
        times = self.t0 + k / streams.VIDEO_FPS
        if self.robot_camera is None:
            joints, elbows, valid = hands_in_camera(window, times)
        else:
            joints, elbows, valid = self._through_chain(window, times)
        self.ticks_made = int(k[-1]) + 1
        return [Tick(float(times[i]), joints[i], elbows[i], valid[i], action, pos_err, arrival)
                for i in range(len(k))]

    def _through_chain(self, window: streams.Stream, times: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sim episode's skeleton (`episode.retarget_stream` + `skeleton_in_camera`) at `times`."""
        n = len(times)
        if self.calib is None:
            return (np.full((n, 2, 21, 3), np.nan, np.float32), np.full((n, 2, 3), np.nan, np.float32),
                    np.zeros((n, 2, 22), bool))
        rs = streams.resample(window, times)
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            palms, elbows = chain_targets(self.calib, rs["trackers"].astype(np.float32))
        fresh = rs["trackers_fresh"].all(1) & rs["hands_fresh"].all(1)
        return hands_through_chain(palms, rs["hands"], elbows, fresh, self.robot_camera)

    def stream(self) -> streams.Stream:
        """The accepted frames as a `rynn-teleop-stream/1` stream (what a recording stores)."""
        return stream_of(self.frames, self.camera)


def stream_of(frames: list[Frame], camera_44: np.ndarray) -> streams.Stream:
    """Frames as a stream whose two clocks are the frames' times."""
    t = np.asarray([f.t for f in frames], np.float64)
    return streams.Stream(t, np.stack([f.tracker_pose for f in frames]), np.stack([f.tracker_valid for f in frames]),
                          t.copy(), np.stack([f.hand_keypoints for f in frames]),
                          np.stack([f.hand_valid for f in frames]), meta={"T_world_camera": camera_44.tolist()})
