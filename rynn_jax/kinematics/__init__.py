"""Embodiment and retargeting for RynnWorld-Teleop digital teleoperation.

assets/rynn_bimanual.xml   the 54-DoF bimanual robot (2 × TIANJI M6 arm + 2 × WUJI hand), MJCF
layout.py                  the 54-D action layout (one place)
mjcf_model.py              MJCF → static kinematic tables / serial chains (via `mujoco`)
se3.py                     rotation / pose math with finite gradients everywhere
fk.py                      JAX forward kinematics, analytic + autodiff Jacobians
ik.py                      differentiable DLS IK with the null-space shoulder prior
tracker.py                 tracker chain T_base · Scale_s(T_chest⁻¹ T_wrist) · T_ee, calibration
chain_hands.py             the operator's hands through that chain, seen from a robot camera (sim skeletons)
hand_retarget.py           MediaPipe-21 → 20 WUJI joints (vector + pinch objective), EMA
retarget.py                one control step / a trajectory: trackers + hands → 54-D action; a whole stream (`retarget_stream`)
streams.py                 recorded-stream file format, reader/writer, resampling
cli.py                     `python -m rynn_jax.kinematics.cli retarget STREAM.npz OUT.npz`
See docs/kinematics.md.
"""
