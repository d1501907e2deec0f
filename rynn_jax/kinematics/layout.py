"""The 54-D action layout of the RynnWorld-Teleop embodiment: the one place that names it.

Per step the teleop engine emits absolute joint positions (radians), ordered as the released
policy code orders them:

    [ left arm 7 | left hand 20 | right arm 7 | right hand 20 ]
      0..6         7..26          27..33        34..53

Arm joints are `arm_joint1..7` (shoulder → wrist of a TIANJI M6). Hand joints are the WUJI
names `finger{1..5}_joint{1..4}`, finger1 = thumb … finger5 = little finger; joint1/joint2 are
the two MCP (or thumb CMC) axes, joint3/joint4 the two distal flexions. In the MJCF each name
carries a `left_`/`right_` prefix, and the MJCF qpos order *is* this layout (checked in tests).
"""

from __future__ import annotations

import jax.numpy as jnp

SIDES: tuple[str, str] = ("left", "right")
ARM_DOF = 7
HAND_DOF = 20
ACTION_DIM = 2 * (ARM_DOF + HAND_DOF)  # 54

ARM_JOINTS: tuple[str, ...] = tuple(f"arm_joint{i}" for i in range(1, ARM_DOF + 1))
HAND_JOINTS: tuple[str, ...] = tuple(
    f"finger{f}_joint{j}" for f in range(1, 6) for j in range(1, 5))

# Slices into the 54-D vector.
LEFT_ARM = slice(0, 7)
LEFT_HAND = slice(7, 27)
RIGHT_ARM = slice(27, 34)
RIGHT_HAND = slice(34, 54)
ARM_SLICES = {"left": LEFT_ARM, "right": RIGHT_ARM}
HAND_SLICES = {"left": LEFT_HAND, "right": RIGHT_HAND}

ACTION_NAMES: tuple[str, ...] = tuple(
    f"{side}_{name}" for side in SIDES for name in ARM_JOINTS + HAND_JOINTS)
assert len(ACTION_NAMES) == ACTION_DIM


def pack_action(arm_q_s7, hand_q_s20):
    """[2,7] arm and [2,20] hand joints (left, right) → [..., 54] action vector."""
    return jnp.concatenate(
        [arm_q_s7[..., 0, :], hand_q_s20[..., 0, :], arm_q_s7[..., 1, :], hand_q_s20[..., 1, :]],
        axis=-1)


def unpack_action(action_54):
    """[..., 54] → ([..., 2, 7] arm, [..., 2, 20] hand)."""
    arm = jnp.stack([action_54[..., LEFT_ARM], action_54[..., RIGHT_ARM]], axis=-2)
    hand = jnp.stack([action_54[..., LEFT_HAND], action_54[..., RIGHT_HAND]], axis=-2)
    return arm, hand
