"""Scripted pick-and-place expert for LIBERO that reads privileged state (object poses), not images.

`PickPlaceExpert`
-----------------
**Use.** One world's expert for LIBERO's "pick X and place it on / in Y" tasks (libero_spatial, libero_object),
driving robosuite's `OSC_POSE` controller in delta mode: a 7-D action in `[-1, 1]`, xyz delta times 0.05 m,
axis-angle rotation times 0.5 rad, gripper -1 open / +1 close, at 20 Hz. It needs only the standard library and
NumPy: it is loaded by file path inside LIBERO's own virtual environment, so it imports nothing first-party.

>>> expert = PickPlaceExpert(repeat=1)
>>> expert.reset()
>>> state = privileged_state(obs, env.env.obj_of_interest)  # doctest: +SKIP
>>> action = expert.action(state)  # [7]; call as often as needed, it changes nothing  # doctest: +SKIP
>>> obs, reward, done, info = env.step(action)  # doctest: +SKIP
>>> expert.update(privileged_state(obs, env.env.obj_of_interest))  # once per env step: advances the phase  # doctest: +SKIP

**State** (`privileged_state`): `eef_pos [3]`, `eef_quat [4]` (x, y, z, w as robosuite writes it), `gripper_qpos
[2]`, `obj_pos [3]`, `obj_quat [4]`, `target_pos [3]`, `target_quat [4]` and the names `obj_name`, `target_name`,
taken from the observation and `obj_of_interest` (the object to move, then the destination).

**Phases.** `approach` (open, move above the grasp point at `hover` height) -> `descend` (to the grasp point) ->
`close` (hold still until the fingers stop moving) -> `lift` (straight up to a carry height above both the start
and the destination) -> `carry` (level, until the object is over the destination) -> `lower` (until the object is
`place_height` above the destination's origin, or the arm stalls) -> `open` (hold still until the fingers have
opened) -> `retreat` (straight up, then hold). If the object slips out during `lift` or `carry` (it falls
`regrasp_drop` below where it was carried), the expert starts again from `approach`. Position control is
saturated proportional control on the end effector; the gripper is always pointed straight down (a proportional
correction of the orientation), turned about the vertical only for objects whose table entry asks for it.

**Grasp points** (`GRASPS`, matched by the longest substring of the object's name): bowls are grasped at the rim
on the robot's side, the wrist turned 90 degrees so that the fingers straddle the wall; libero_object's groceries
at their centre. Each entry gives the grasp point's offset from the object's origin, the wrist's yaw, how high over
the destination the object is released, and how far the object reaches below its origin (to carry it clear of the
destination, `DESTINATION_TOPS`).

**Action repeat.** With `repeat=k` the caller applies each action for `k` env steps in a row (and calls `update`
after each of them); the position and rotation gains are divided by `k`, so that the held action asks in total for
about the remaining error and does not overshoot. The controller lags behind its goal, so an episode at `repeat=4`
takes about 1.8 times the env steps of one at `repeat=1` (163 against 88 on libero_spatial task 0). Phase timers
count `update` calls (env steps), so they mean the same at any repeat.

**Where it departs from a human demonstrator.** It sees exact object poses (no perception, no occlusion); it moves
in straight lines at saturated speed with a fixed downward wrist, where LIBERO's human demonstrations (teleoperated
with a SpaceMouse) curve, pause, rotate the wrist and regrasp; it knows nothing of obstacles other than the object
and the destination, so it clears them only by carrying high; it retries a dropped object, which demonstrations do
rarely; and it is deterministic for a given state (no demonstration-like noise).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

POS_SCALE = 0.05  # metres per unit of the OSC_POSE position action
ROT_SCALE = 0.5  # radians per unit of the OSC_POSE rotation action
DOWN_QUAT = np.array([1.0, 0.0, 0.0, 0.0])  # x, y, z, w: gripper pointing straight down, fingers along world y

PHASES = ("approach", "descend", "close", "lift", "carry", "lower", "open", "retreat")


class Grasp(NamedTuple):
    """How to grasp and release one kind of object (a NamedTuple, not a dataclass: this file is loaded by path,
    outside `sys.modules`, where dataclasses cannot resolve their annotations).

    Args:
        offset: Grasp point relative to the object's origin (metres) `[3]`, in the gripper's frame turned by
            `yaw` about the vertical: y is along the finger axis, mirrored to the side the gripper comes from.
        place_height: Release when the object's origin is this far above the destination's origin (metres).
        yaw: Turn the gripper about the vertical by this angle (radians) before grasping.
        bottom: Height of the object's origin above its lowest point (metres), to carry it clear of the destination.
    """

    offset: tuple[float, float, float]
    place_height: float
    yaw: float = 0.0
    bottom: float = 0.0


def _centre(half_height: float) -> Grasp:
    """A small object whose origin is its centre, grasped 1 cm above it and released 3 cm above the floor."""
    return Grasp(offset=(0.0, 0.0, min(0.01, half_height)), place_height=half_height + 0.03, bottom=half_height)


# Matched by the longest substring of the object's name. Bowls: origin at the base, rim 0.053 m up, outer radius
# 0.056 m; the gripper turns 90 degrees so that its fingers open along world x and straddle the wall on the robot's
# side (x - 0.052): the y sides are blocked in "bowl in the top drawer" (drawer front and cabinet body).
_RIM = Grasp(offset=(0.0, 0.052, 0.042), place_height=0.03, yaw=np.pi / 2)
# libero_object's groceries have their origin at their centre; their half heights (from the meshes) set how high
# they are carried and released. The fingers (open along world y) take the narrow side of every one of them as
# LIBERO lays them out (at most 0.07 m across, the gripper opens 0.08 m).
GRASPS: dict[str, Grasp] = {
    "bowl": _RIM,
    "alphabet_soup": _centre(0.042),
    "tomato_sauce": _centre(0.042),
    "cream_cheese": _centre(0.010),
    "butter": _centre(0.009),
    "chocolate_pudding": _centre(0.015),
    "salad_dressing": _centre(0.074),
    "ketchup": _centre(0.074),
    "bbq_sauce": _centre(0.057),
    "milk": _centre(0.071),
    "orange_juice": _centre(0.072),
    "": _centre(0.04),  # default: an unknown small object, grasped at its centre
}

# Height of each destination's top above its origin (metres): carry the object's lowest point this high plus a margin.
DESTINATION_TOPS: dict[str, float] = {"plate": 0.016, "basket": 0.147, "": 0.05}


def grasp_for(name: str) -> Grasp:
    """The `GRASPS` entry whose key is the longest substring of `name`."""
    return GRASPS[max((k for k in GRASPS if k in name), key=len)]


def destination_top(name: str) -> float:
    """The `DESTINATION_TOPS` entry whose key is the longest substring of `name`."""
    return DESTINATION_TOPS[max((k for k in DESTINATION_TOPS if k in name), key=len)]


def privileged_state(obs: dict, obj_of_interest: list[str]) -> dict:
    """The expert's state from a LIBERO observation dict and `env.env.obj_of_interest` ([object, destination])."""
    obj_name, target_name = obj_of_interest[0], obj_of_interest[-1]
    for name in (obj_name, target_name):
        if f"{name}_pos" not in obs:
            raise KeyError(f"observation has no '{name}_pos' (obj_of_interest={obj_of_interest})")
    return dict(
        eef_pos=np.asarray(obs["robot0_eef_pos"], dtype=np.float64),
        eef_quat=np.asarray(obs["robot0_eef_quat"], dtype=np.float64),
        gripper_qpos=np.asarray(obs["robot0_gripper_qpos"], dtype=np.float64),
        obj_pos=np.asarray(obs[f"{obj_name}_pos"], dtype=np.float64),
        obj_quat=np.asarray(obs[f"{obj_name}_quat"], dtype=np.float64),
        target_pos=np.asarray(obs[f"{target_name}_pos"], dtype=np.float64),
        target_quat=np.asarray(obs[f"{target_name}_quat"], dtype=np.float64),
        obj_name=obj_name,
        target_name=target_name,
    )


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of quaternions in x, y, z, w order."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )


def quat_conj(q: np.ndarray) -> np.ndarray:
    """Conjugate (the inverse of a unit quaternion), x, y, z, w order."""
    return np.array([-q[0], -q[1], -q[2], q[3]])


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """Rotation vector (axis times angle in (-pi, pi]) of a unit quaternion in x, y, z, w order `[3]`."""
    q = q / np.linalg.norm(q)
    if q[3] < 0:  # the short way round
        q = -q
    s = np.linalg.norm(q[:3])
    if s < 1e-9:
        return np.zeros(3)
    return q[:3] / s * 2.0 * np.arctan2(s, q[3])


def yaw_quat(angle: float) -> np.ndarray:
    """Rotation about world z, x, y, z, w order."""
    return np.array([0.0, 0.0, np.sin(angle / 2), np.cos(angle / 2)])


class PickPlaceExpert:
    """One world's scripted pick-and-place expert (see the module docstring).

    Args:
        repeat: Env steps each action is applied for; gains are divided by it.
        pos_gain: Proportional gain on the position error at `repeat=1` (action units per 0.05 m).
        rot_gain: Proportional gain on the orientation error at `repeat=1` (action units per 0.5 rad).
        hover: Height of the approach point above the grasp point (metres).
        carry_clearance: Carry the object's origin this far above the higher of its start and the destination
            (and its lowest point at least 5 cm above the destination's top).
        tol: Position tolerance to end `approach`, `descend`, `carry` (metres).
        regrasp_drop: Start again from `approach` when the held object falls this far below the hand's grasp.
    """

    def __init__(
        self,
        repeat: int = 1,
        pos_gain: float = 1.0,
        rot_gain: float = 1.0,
        hover: float = 0.08,
        carry_clearance: float = 0.12,
        tol: float = 0.01,
        regrasp_drop: float = 0.05,
    ):
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        self.repeat = int(repeat)
        self.pos_gain = float(pos_gain)
        self.rot_gain = float(rot_gain)
        self.hover = float(hover)
        self.carry_clearance = float(carry_clearance)
        self.tol = float(tol)
        self.regrasp_drop = float(regrasp_drop)
        self.reset()

    # ------------------------------------------------------------------ episode bookkeeping

    def reset(self) -> None:
        """Forget the last episode: start again from `approach`."""
        self.phase = "approach"
        self.steps_in_phase = 0  # update() calls since the phase began
        self.side = 0.0  # +1 or -1: which side of the object (along the finger axis) to grasp; set on first update
        self.start_z = None  # object's height when first seen
        self.hold_offset = None  # eef - object once grasped [3]
        self.last_eef = None
        self.last_grip = None
        self.stall = 0  # consecutive updates in which the eef barely moved
        self.retreat_z = None

    # ------------------------------------------------------------------ geometry

    def _grasp(self, state: dict) -> Grasp:
        return grasp_for(state["obj_name"])

    def _finger_axis(self, state: dict) -> np.ndarray:
        """World direction the fingers open along `[3]`: world y turned by the grasp's yaw."""
        yaw = self._grasp(state).yaw
        return np.array([-np.sin(yaw), np.cos(yaw), 0.0])

    def _side(self, state: dict) -> float:
        if self.side:
            return self.side
        # The side of the object nearer the gripper: shorter approach, and the far side is often crowded.
        return 1.0 if np.dot(state["eef_pos"] - state["obj_pos"], self._finger_axis(state)) > 0 else -1.0

    def _grasp_point(self, state: dict) -> np.ndarray:
        """Object origin + the grasp's offset, its y part along the finger axis on the chosen side `[3]`."""
        g = self._grasp(state)
        yaw = g.yaw
        along = np.array([np.cos(yaw), np.sin(yaw), 0.0]) * g.offset[0]
        across = self._finger_axis(state) * g.offset[1] * self._side(state)
        return state["obj_pos"] + along + across + np.array([0.0, 0.0, g.offset[2]])

    def _carry_z(self, state: dict) -> float:
        """eef height for carrying: the object's origin `carry_clearance` above the start and the destination, and
        its lowest point 5 cm above the destination's top."""
        start_z = self.start_z if self.start_z is not None else state["obj_pos"][2]
        offset_z = self.hold_offset[2] if self.hold_offset is not None else self._grasp(state).offset[2]
        target_z = state["target_pos"][2]
        clear_top = target_z + destination_top(state["target_name"]) + self._grasp(state).bottom + 0.05
        return max(start_z + self.carry_clearance, target_z + self.carry_clearance, clear_top) + offset_z

    def _place_eef(self, state: dict) -> np.ndarray:
        """eef position that puts the held object's origin `place_height` above the destination's origin."""
        offset = self.hold_offset if self.hold_offset is not None else state["eef_pos"] - state["obj_pos"]
        goal_obj = state["target_pos"] + np.array([0.0, 0.0, self._grasp(state).place_height])
        return goal_obj + offset

    def _goal(self, state: dict) -> tuple[np.ndarray, float]:
        """(eef goal [3], gripper command) of the current phase."""
        eef = state["eef_pos"]
        if self.phase == "approach":
            return self._grasp_point(state) + np.array([0.0, 0.0, self.hover]), -1.0
        if self.phase == "descend":
            return self._grasp_point(state), -1.0
        if self.phase == "close":
            return self._grasp_point(state), 1.0
        if self.phase == "lift":
            return np.array([eef[0], eef[1], self._carry_z(state)]), 1.0
        if self.phase == "carry":
            place = self._place_eef(state)
            return np.array([place[0], place[1], self._carry_z(state)]), 1.0
        if self.phase == "lower":
            return self._place_eef(state), 1.0
        if self.phase == "open":
            return eef.copy(), -1.0
        # retreat: straight up from where the object was released, then hold
        z = self.retreat_z if self.retreat_z is not None else eef[2] + 0.1
        return np.array([eef[0], eef[1], z]), -1.0

    def _target_quat(self, state: dict) -> np.ndarray:
        return quat_mul(yaw_quat(self._grasp(state).yaw), DOWN_QUAT)

    # ------------------------------------------------------------------ policy

    def action(self, state: dict) -> np.ndarray:
        """The action for `state` `[7]` in [-1, 1]. Pure: changes no internal state."""
        goal, grip = self._goal(state)
        k = self.pos_gain / self.repeat
        dpos = k * (goal - state["eef_pos"]) / POS_SCALE
        # Saturate as a vector so straight lines stay straight.
        dpos = dpos / max(1.0, np.abs(dpos).max())
        if self.phase in ("close", "open"):
            dpos = np.zeros(3)  # hold still while the fingers move: pulling now would drag the object
        err = quat_to_axis_angle(quat_mul(self._target_quat(state), quat_conj(state["eef_quat"])))
        drot = np.clip(self.rot_gain / self.repeat * err / ROT_SCALE, -1.0, 1.0)
        return np.concatenate([dpos, drot, [grip]]).astype(np.float64)

    def update(self, state: dict) -> None:
        """Advance the phase machine given the state after an env step (call once per env step)."""
        if self.start_z is None:
            self.start_z = float(state["obj_pos"][2])
        if not self.side:
            self.side = self._side(state)
        eef = state["eef_pos"]
        moved = np.inf if self.last_eef is None else float(np.linalg.norm(eef - self.last_eef))
        self.stall = self.stall + 1 if moved < 0.0015 else 0
        grip = float(state["gripper_qpos"][0] - state["gripper_qpos"][1])  # finger opening (metres)
        grip_moving = self.last_grip is None or abs(grip - self.last_grip) > 2e-4
        self.last_eef, self.last_grip = eef.copy(), grip
        self.steps_in_phase += 1

        goal, _ = self._goal(state)
        err = goal - eef
        phase = self.phase
        if phase == "approach":
            if np.abs(err[:2]).max() < self.tol and abs(err[2]) < 2 * self.tol:
                self._enter("descend")
        elif phase == "descend":
            if np.abs(err).max() < 0.6 * self.tol or (self.stall >= 3 and self.steps_in_phase > 5):
                self._enter("close")
        elif phase == "close":
            if self.steps_in_phase >= 6 and not grip_moving:
                self.hold_offset = eef - state["obj_pos"]
                self._enter("lift")
        elif phase in ("lift", "carry") and self._dropped(state):
            self.hold_offset = None
            self._enter("approach")
        elif phase == "lift":
            if abs(err[2]) < 2 * self.tol:
                self._enter("carry")
        elif phase == "carry":
            if np.abs(err[:2]).max() < self.tol and abs(err[2]) < 3 * self.tol:
                self._enter("lower")
        elif phase == "lower":
            if np.abs(err).max() < 0.6 * self.tol or (self.stall >= 3 and self.steps_in_phase > 5):
                self._enter("open")
        elif phase == "open":
            if self.steps_in_phase >= 4 and not grip_moving:
                self.retreat_z = float(eef[2] + 0.1)
                self._enter("retreat")

    def _dropped(self, state: dict) -> bool:
        """The object is no longer moving with the hand: it fell more than `regrasp_drop` below the grasp."""
        if self.hold_offset is None:
            return False
        expected_obj = state["eef_pos"] - self.hold_offset
        return bool(expected_obj[2] - state["obj_pos"][2] > self.regrasp_drop)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.steps_in_phase = 0
        self.stall = 0
