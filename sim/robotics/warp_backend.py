"""N MuJoCo worlds stepped and rendered as one batch by MuJoCo Warp: the GPU-parallel path of `reach` and `push`.

`PlanarMujocoEnv(backend="warp")` keeps its per-world `MjData` as a host mirror, where seeding and task logic run as
before, and hands physics and rendering to `WarpWorlds`: one `mujoco_warp` model and data with `nworld = N`, whose
`step` advances every world in one launch per kernel and whose ray-traced `render` draws all N images at once.
Warp runs on the env's `device`: `"cuda"` on an NVIDIA GPU (the point of this path), `"cpu"` for development and the
tests (MuJoCo Warp supports the CPU for that; it is far slower than plain MuJoCo there).

State crosses between host and device only where the task logic needs it: the reset worlds' state goes up once per
reset, and `qpos`/`qvel` come down after each env step (a few floats per world), with the images.

MuJoCo Warp computes in float32, plain MuJoCo in float64, and Warp ray-traces where MuJoCo rasterises with OpenGL
(with anti-aliasing): in the tests' episodes positions agree to better than 1e-6 m (the tests allow 1e-4), and
images differ at the edges of shapes (tests/sim/test_warp_backend.py checks both against the `mujoco` backend).

What stays on the host, per env step: the per-world Python loop that sets controls and mirrors `qpos`/`qvel`, the
task logic (numpy), and the images, copied to host memory. On an H100 (BENCHMARKS.md) the batch is 3.2x plain
MuJoCo's env-steps/s at 4096 worlds and 5.3x at 16384, about 26 us a world-step in all; how much of that is this
host loop has not been measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def import_warp() -> tuple[Any, Any]:
    """`(warp, mujoco_warp)`, quiet, or an ImportError that says which extra installs them."""
    try:
        import warp as wp

        wp.config.quiet = True
        import mujoco_warp as mjw
    except ImportError as error:
        raise ImportError(
            "backend='warp' needs MuJoCo Warp: pip install 'mmrl[warp]' (mujoco-warp and warp-lang)"
        ) from error
    return wp, mjw


def warp_device(device: torch.device) -> str:
    """The Warp device name for a torch device (`"cpu"` or `"cuda:K"`).

    Raises:
        ValueError: A device Warp cannot run on (MuJoCo Warp supports CUDA and the CPU only).
    """
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"backend='warp' runs on 'cpu' or 'cuda' devices, got device={str(device)!r}")


class WarpWorlds:
    """Physics and rendering of N worlds of one `MjModel` in MuJoCo Warp.

    Args:
        model: The host model (shared by the env's mirror `MjData`s).
        num_envs: N.
        image_size: Side of the square images rendered.
        camera_id: The model camera whose images are rendered.
        shadows: Ray-trace shadows of lights that cast them.
        device: Where Warp runs (`cpu` or `cuda[:K]`).
    """

    # The fields of the state that the env's reset sets or the physics integrates; everything else is derived.
    _STATE = ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "time", "qacc_warmstart")

    def __init__(
        self, model: Any, num_envs: int, image_size: int, camera_id: int, shadows: bool, device: torch.device
    ):
        wp, mjw = import_warp()
        self._wp, self._mjw = wp, mjw
        self.device = warp_device(device)
        self.num_envs = num_envs
        self.camera_id = camera_id
        with wp.ScopedDevice(self.device):
            self.model = mjw.put_model(model)
            self.data = mjw.make_data(model, nworld=num_envs)
            self.render_context = mjw.create_render_context(
                model,
                nworld=num_envs,
                cam_res=(image_size, image_size),
                render_rgb=True,
                render_depth=False,
                use_shadows=shadows,
                cam_active=[camera_id],  # only the env's camera is drawn; `get_rgb` then reads it as camera 0
            )
            self._rgb = wp.zeros((num_envs, image_size, image_size), dtype=wp.vec3)  # [N, H, W] in [0, 1]
        # Torch views of the device arrays (no copies): [N, nq], [N, nv], [N, nu], [N, nmocap, 3], ... .
        self._views = {name: wp.to_torch(getattr(self.data, name)) for name in self._STATE}
        self._rgb_view = wp.to_torch(self._rgb)  # [N, H, W, 3] float32

    def upload(self, env_ids: np.ndarray, datas: list[Any]) -> None:
        """Reset the worlds `env_ids` on the device to the state of their host `MjData`, and recompute them.

        Args:
            env_ids: Indices of the worlds to set, `[R]` int.
            datas: The env's host `MjData`s, one per world (those of `env_ids` freshly reset and initialised).
        """
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[env_ids] = True
        with self._wp.ScopedDevice(self.device):
            self._mjw.reset_data(self.model, self.data, reset=self._wp.array(mask, dtype=bool))
        index = torch.as_tensor(env_ids, dtype=torch.long, device=self._views["qpos"].device)
        for name in ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "time"):
            host = np.stack([np.asarray(getattr(datas[k], name), dtype=np.float32) for k in env_ids])
            view = self._views[name]
            view[index] = torch.from_numpy(host).reshape(len(env_ids), *view.shape[1:]).to(view.device)
        with self._wp.ScopedDevice(self.device):
            # Derived quantities (body and camera poses) of every world from its state; reset worlds need them to be
            # drawn, and the others get the values their next step computes first anyway.
            self._mjw.forward(self.model, self.data)

    def step(self, ctrl: np.ndarray, live: np.ndarray, substeps: int) -> tuple[np.ndarray, np.ndarray]:
        """Set the live worlds' controls, advance them `substeps` physics steps and return every world's state.

        Worlds that are not live keep their state exactly: they are stepped with the rest (one batch) and then
        restored.

        Args:
            ctrl: `[N, nu]` controls; rows of worlds that are not live are ignored.
            live: `[N]` bool, the worlds to advance.
            substeps: Physics steps to take.

        Returns:
            `qpos` `[N, nq]` and `qvel` `[N, nv]` float64 on the host, after the step.
        """
        views = self._views
        live_t = torch.from_numpy(live).to(views["qpos"].device)
        views["ctrl"][live_t] = torch.from_numpy(ctrl[live].astype(np.float32)).to(views["ctrl"].device)
        frozen = ~live_t
        saved = {name: views[name][frozen].clone() for name in self._STATE} if not live.all() else {}
        with self._wp.ScopedDevice(self.device):
            for _ in range(substeps):
                self._mjw.step(self.model, self.data)
        for name, value in saved.items():
            views[name][frozen] = value
        return views["qpos"].double().cpu().numpy(), views["qvel"].double().cpu().numpy()

    def render(self) -> torch.Tensor:
        """Every world's image from the env's camera, `[N, H, W, 3]` uint8 on the host."""
        with self._wp.ScopedDevice(self.device):
            # The ray tracer's bounding-volume hierarchy holds each geom's bounds: refit it to where geoms are now.
            self._mjw.refit_bvh(self.model, self.data, self.render_context)
            self._mjw.render(self.model, self.data, self.render_context)
            # get_rgb takes the camera's index among the active ones, not its model id (model ids read unwritten
            # memory for any camera but the model's first).
            self._mjw.get_rgb(self.render_context, 0, self._rgb)
        return (self._rgb_view * 255.0).round_().clamp_(0, 255).to(torch.uint8).cpu()
