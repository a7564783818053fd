"""The rule-based driver of the `highway` env: meta-actions (text mode) or acceleration and steering (continuous).

`HighwayExpert` is the part of `sim.driving.highway.HighwayEnv` that drives: `expert_action(noise, generator)` for
every world, from the ego's and the other cars' states (headway, time to collision, a constant-velocity
prediction of the route ahead). The module docstring of `sim.driving.highway` describes what it does and how well.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from sim.base import check_expert_noise

_HEADWAY_S = 1.5  # time gap kept to the car ahead (the env's `expert_headway`, by default)
_MIN_GAP_M = 6.0  # plus this standstill distance (scaled with the headway)
_TTC_S = 3.0  # closing on the car ahead faster than this counts as blocked (scaled with the headway)
_CORRIDOR_AHEAD_M = 10.0  # the conflict check's corridor in front of the ego
_CORRIDOR_HALF_WIDTH_M = 2.5
_HORIZON_S = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # instants of the constant-velocity prediction
_PREDICTION_S = np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0])  # instants of the expert's route prediction
_PREDICTION_RANGE_M = 80.0  # cars farther than this are left out of the prediction
_CONFLICT_LON_M = 7.0  # a conflict: another car's centre this close along the ego's heading...
_CONFLICT_LAT_M = 3.0  # ...and this close across it (adjacent lanes are 4 m apart), for cars heading its way
_CONFLICT_RADIUS_M = 7.0  # a crossing car (heading more than _PARALLEL_RAD off) this close is a conflict
_PARALLEL_RAD = 0.25
_SPEED_LAG_S = 0.6  # highway-env's speed controller time constant (TAU_ACC)


class HighwayExpert:
    """The expert's methods, mixed into `HighwayEnv` (they read its worlds, `_envs`, its action settings, and its
    `expert_headway` and `expert_speed_check`)."""

    expert_headway: float  # set by `HighwayEnv.__init__`, whose defaults are the only ones
    expert_speed_check: bool

    def _gaps(self) -> tuple[float, float, float]:
        """(headway s, standstill gap m, time-to-collision threshold s), the defaults scaled by `expert_headway`."""
        scale = self.expert_headway / _HEADWAY_S
        return self.expert_headway, _MIN_GAP_M * scale, _TTC_S * scale

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str] | torch.Tensor:
        """The rule-based driver's action for every world (see the module docstring).

        Args:
            noise: Text mode: the probability of a uniformly random meta-action instead of the expert's.
                Continuous mode: the std of Gaussian noise added to the action (then clipped to [-1, 1]).
            generator: Source of the noise; required when `noise > 0`.

        Returns:
            Text mode: N meta-action names (e.g. `"FASTER"`), or their letters with `answer="letter"`. Continuous
            mode: `[N, 2]` float32 in [-1, 1].
        """
        check_expert_noise(noise, generator, probability=self.action_mode == "text")
        if self.action_mode == "continuous":
            action = torch.tensor(
                np.array([self._expert_control(env) for env in self._envs]), dtype=torch.float32
            )  # [N, 2]
            if noise > 0:
                action = action + noise * torch.randn(action.shape, generator=generator)
            return action.clamp(-1.0, 1.0)
        names = [self._expert_meta(env) for env in self._envs]
        if noise > 0:
            draws = torch.rand(self.num_envs, generator=generator).tolist()
            picks = torch.randint(len(self.actions), (self.num_envs,), generator=generator).tolist()
            names = [self.actions[p] if u < noise else name for name, u, p in zip(names, draws, picks)]
        if self.answer == "letter":
            return [self.letters[name] for name in names]
        return names

    def _expert_meta(self, env: Any) -> str:
        """The expert's meta-action for one world, from its vehicle state."""
        vehicle, road = env.vehicle, env.road
        speed = float(vehicle.speed)
        lane_index = getattr(vehicle, "target_lane_index", None) or vehicle.lane_index
        headway_s, min_gap, ttc = self._gaps()
        headway = speed * headway_s + min_gap
        front_gap, closing = _leader_gap(road, vehicle, lane_index)
        blocked = front_gap < headway or (closing > 0 and front_gap / closing < ttc)
        blocked = blocked or _merging_nearby(road, vehicle, 2 * headway)
        if blocked:
            changing = lane_index != vehicle.lane_index
            if not changing:
                options = []
                for name, side in (("LANE_LEFT", -1), ("LANE_RIGHT", 1)):
                    if name not in self.actions:
                        continue
                    _from, _to, _id = lane_index
                    if not 0 <= _id + side < len(road.network.graph[_from][_to]):
                        continue
                    candidate = (_from, _to, _id + side)
                    gap, _ = _leader_gap(road, vehicle, candidate)
                    rear_gap, rear_closing = _follower_gap(road, vehicle, candidate)
                    if gap > headway + 5.0 and rear_gap > max(rear_closing, 0.0) * headway_s + min_gap:
                        options.append((gap, name))
                if options:
                    return max(options)[1]
            wanted = "SLOWER"
        else:
            top = float(self._target_speeds.max())
            wanted = "FASTER" if speed < top - 0.5 and front_gap > 2 * headway else "IDLE"
        return self._safe_speed_action(vehicle, road, wanted) if self.expert_speed_check else wanted

    def _safe_speed_action(self, vehicle: Any, road: Any, wanted: str) -> str:
        """`wanted` if the route ahead stays clear at the speed it leads to, else the first of the others that does.

        Each candidate's ego trajectory follows the ego's route at a speed relaxing to the candidate's target speed
        (highway-env's 0.6 s speed lag); the other cars follow their routes at constant speed. A candidate is clear
        when no other car comes within `_CONFLICT_LON_M` along and `_CONFLICT_LAT_M` across the ego's heading at any
        instant of `_HORIZON_S`. With no clear candidate, the one keeping the largest clearance wins.
        """
        candidates = [wanted] + [a for a in ("IDLE", "SLOWER", "FASTER") if a != wanted]
        candidates = [a for a in candidates if a in self.actions]
        speeds = self._target_speeds
        index = int(np.argmin(np.abs(speeds - float(getattr(vehicle, "target_speed", vehicle.speed)))))
        step = {"FASTER": 1, "IDLE": 0, "SLOWER": -1}
        others = [
            _predicted_positions(other, road)
            for other in road.vehicles
            if other is not vehicle and _distance(other, vehicle) < _PREDICTION_RANGE_M
        ]
        best, best_clearance = candidates[0], -math.inf
        for action in candidates:
            target = float(speeds[int(np.clip(index + step[action], 0, len(speeds) - 1))])
            clearance = _clearance(_predicted_positions(vehicle, road, target), others)
            if clearance >= 1.0:
                return action
            if clearance > best_clearance:
                best, best_clearance = action, clearance
        return best

    def _expert_control(self, env: Any) -> np.ndarray:
        """The continuous expert for one world: `[2]` normalised (acceleration, steering), lane keeping."""
        vehicle, road = env.vehicle, env.road
        speed = float(vehicle.speed)
        headway_s, min_gap, ttc = self._gaps()
        headway = speed * headway_s + min_gap
        front_gap, closing = _leader_gap(road, vehicle, vehicle.lane_index)
        blocked = front_gap < headway or (closing > 0 and front_gap / closing < ttc) or _conflict_ahead(road, vehicle)
        target = max(speed - 5.0, 0.0) if blocked else float(self._target_speeds.max())
        action_type = env.action_type
        acceleration = (target - speed) / 0.6  # highway-env's speed law, KP_A = 1 / TAU_ACC
        steering = _lane_keeping_steering(vehicle, road.network.get_lane(vehicle.lane_index))
        acc_high = float(action_type.acceleration_range[1])
        steer_high = float(action_type.steering_range[1])
        return np.clip([acceleration / acc_high, steering / steer_high], -1.0, 1.0)


def _leader_gap(road: Any, vehicle: Any, lane_index: Any) -> tuple[float, float]:
    """(bumper-to-bumper gap in m, closing speed in m/s) to the car ahead on `lane_index`; (inf, 0) if none."""
    front, _ = road.neighbour_vehicles(vehicle, lane_index)
    if front is None:
        return math.inf, 0.0
    lane = road.network.get_lane(lane_index)
    gap = lane.local_coordinates(front.position)[0] - lane.local_coordinates(vehicle.position)[0]
    gap -= (front.LENGTH + vehicle.LENGTH) / 2
    return max(float(gap), 0.0), float(vehicle.speed - front.speed)


def _follower_gap(road: Any, vehicle: Any, lane_index: Any) -> tuple[float, float]:
    """(gap in m, closing speed in m/s) of the car behind on `lane_index`; (inf, 0) if none."""
    _, rear = road.neighbour_vehicles(vehicle, lane_index)
    if rear is None:
        return math.inf, 0.0
    lane = road.network.get_lane(lane_index)
    gap = lane.local_coordinates(vehicle.position)[0] - lane.local_coordinates(rear.position)[0]
    gap -= (rear.LENGTH + vehicle.LENGTH) / 2
    return max(float(gap), 0.0), float(rear.speed - vehicle.speed)


def time_to_collision(road: Any, vehicle: Any) -> float:
    """Seconds until the ego reaches the car ahead in its lane at current speeds; inf when not closing."""
    gap, closing = _leader_gap(road, vehicle, vehicle.lane_index)
    return gap / closing if closing > 0 and math.isfinite(gap) else math.inf


def _conflict_ahead(road: Any, vehicle: Any) -> bool:
    """Whether another car, extrapolated at constant velocity, enters the corridor ahead of the ego within 3 s."""
    position = np.asarray(vehicle.position, dtype=np.float64)
    velocity = np.asarray(vehicle.velocity, dtype=np.float64)
    forward = np.array([math.cos(vehicle.heading), math.sin(vehicle.heading)])
    left = np.array([-forward[1], forward[0]])
    for other in road.vehicles:
        if other is vehicle:
            continue
        rel_position = np.asarray(other.position, dtype=np.float64) - position
        if rel_position @ rel_position > 60.0**2:  # out of reach within the horizon
            continue
        if float(rel_position @ forward) <= 0.0:  # behind: slowing down would only invite it closer
            continue
        rel_velocity = np.asarray(other.velocity, dtype=np.float64) - velocity
        for t in _HORIZON_S:
            rel = rel_position + rel_velocity * t
            ahead, side = float(rel @ forward), float(rel @ left)
            if 0.0 < ahead < _CORRIDOR_AHEAD_M + vehicle.LENGTH and abs(side) < _CORRIDOR_HALF_WIDTH_M:
                return True
    return False


def _merging_nearby(road: Any, vehicle: Any, reach: float) -> bool:
    """Whether a car on a merging ramp (a `forbidden` lane) is beside or up to `reach` metres ahead of the ego and
    within two lane widths of it: it may cut in, so the expert treats its lane as blocked."""
    forward = np.array([math.cos(vehicle.heading), math.sin(vehicle.heading)])
    for other in road.vehicles:
        if other is vehicle or not getattr(other.lane, "forbidden", False):
            continue
        offset = np.asarray(other.position, dtype=np.float64) - np.asarray(vehicle.position, dtype=np.float64)
        along, across = float(offset @ forward), float(offset[1] * forward[0] - offset[0] * forward[1])
        if -vehicle.LENGTH < along < reach and abs(across) < 2 * 4.0:
            return True
    return False


def _distance(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a.position, dtype=np.float64) - np.asarray(b.position, dtype=np.float64)))


def _predicted_positions(vehicle: Any, road: Any, target_speed: float | None = None) -> np.ndarray:
    """`[T, 3]` (x, y, heading) of a car along its route at `_PREDICTION_S`.

    With `target_speed`, the speed relaxes to it with highway-env's lag; without, it stays constant.
    """
    lane = vehicle.lane
    start = lane.local_coordinates(vehicle.position)[0]
    v0 = float(vehicle.speed)
    t = _PREDICTION_S
    if target_speed is None:
        travelled = v0 * t
    else:
        travelled = target_speed * t + (v0 - target_speed) * _SPEED_LAG_S * (1 - np.exp(-t / _SPEED_LAG_S))
    route = getattr(vehicle, "route", None) or [vehicle.lane_index]
    rows = []
    for distance in travelled:
        s = start + float(distance)
        try:
            position, heading = road.network.position_heading_along_route(route, s, 0, vehicle.lane_index)
        except (IndexError, KeyError):  # highway-env fails on some routes whose roads have fewer lanes
            position, heading = lane.position(s, 0), lane.heading_at(s)  # the current lane, extended
        rows.append((float(position[0]), float(position[1]), float(heading)))
    return np.array(rows)


def _clearance(ego: np.ndarray, others: list[np.ndarray]) -> float:
    """The smallest normalised separation of the ego's predicted poses from the others' (>= 1: no conflict).

    At each instant, a car heading the ego's way (within `_PARALLEL_RAD`) is separated by the larger of
    `|along| / _CONFLICT_LON_M` and `|across| / _CONFLICT_LAT_M` in the ego's heading frame (cars in adjacent lanes
    pass 4 m apart); a car crossing at an angle by its distance over `_CONFLICT_RADIUS_M` (two cars meeting at an
    angle touch with their centres further apart across than side by side).
    """
    if not others:
        return math.inf
    forward = np.stack([np.cos(ego[:, 2]), np.sin(ego[:, 2])], axis=-1)  # [T, 2]
    left = np.stack([-forward[:, 1], forward[:, 0]], axis=-1)
    smallest = math.inf
    for other in others:
        offset = other[:, :2] - ego[:, :2]  # [T, 2]
        along = np.abs((offset * forward).sum(-1)) / _CONFLICT_LON_M
        across = np.abs((offset * left).sum(-1)) / _CONFLICT_LAT_M
        angle = np.abs((other[:, 2] - ego[:, 2] + np.pi) % (2 * np.pi) - np.pi)  # [T]
        separation = np.where(
            angle < _PARALLEL_RAD, np.maximum(along, across), np.linalg.norm(offset, axis=-1) / _CONFLICT_RADIUS_M
        )
        smallest = min(smallest, float(separation.min()))
    return smallest


def _lane_keeping_steering(vehicle: Any, lane: Any) -> float:
    """highway-env's `ControlledVehicle.steering_control` law (pursuit of the lane centre), in radians.

    Plain `Vehicle`s (continuous mode) lack the controller's constants, so the law is restated with them.
    """
    tau_heading = 0.2
    kp_lateral, kp_heading, tau_pursuit = 1 / 0.6, 1 / tau_heading, 0.5 * tau_heading
    speed = float(vehicle.speed) if abs(vehicle.speed) > 1e-2 else 1e-2
    longitudinal, lateral = lane.local_coordinates(vehicle.position)
    future_heading = lane.heading_at(longitudinal + speed * tau_pursuit)
    heading_command = math.asin(float(np.clip(-kp_lateral * lateral / speed, -1, 1)))
    heading_ref = future_heading + float(np.clip(heading_command, -math.pi / 4, math.pi / 4))
    heading_error = (heading_ref - float(vehicle.heading) + math.pi) % (2 * math.pi) - math.pi
    slip = math.asin(float(np.clip(vehicle.LENGTH / 2 / speed * kp_heading * heading_error, -1, 1)))
    return float(np.clip(math.atan(2 * math.tan(slip)), -math.pi / 3, math.pi / 3))
