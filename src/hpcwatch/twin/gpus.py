"""The twin's GPU physics: from what a job makes a GPU do (utilisation, tensor activity, memory) to its
power, memory, temperature and clocks, as dcgm-exporter reports them.

A busy GPU draws power between its idle and its TDP with its activity; its temperature follows the
power to ``inlet + c_per_w x P`` with the cooling's time constant; near the TDP it caps its clock,
and at its slowdown temperature the clock halves. ``GpuPhysics`` is held by the Twin (composition,
not a mixin): it owns every GPU's spec numbers and the one state carried from tick to tick, the
temperature; each tick the Twin hands it the tick's utilisation and activity and the random draws,
and it writes the columns of the Twin's ``fields``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcwatch import vocab
from hpcwatch.model import Gpu
from hpcwatch.model.catalog import GPU_SLOWDOWN_TEMP_C
from hpcwatch.model.cluster import Cooling
from hpcwatch.twin.devices import FIELD, SM_CLOCK_IDLE_MHZ, SM_CLOCK_MAX_MHZ

__all__ = ["GpuPhysics", "POWER_THROTTLE_FRACTION", "THERMAL_SLOWDOWN_CLOCK_FACTOR"]

#: Fraction of TDP above which the GPU starts to pull its clock down (power capping).
POWER_THROTTLE_FRACTION = 0.93
#: Temperature model: T -> inlet + c_per_w x P, first order with the cooling's time constant; the cluster model's
#: ``cooling`` (model/catalog.py COOLING: liquid = the fit of the H200 capture, 56 C at 680 W; air hotter, slower).
#: At the GPU's slowdown temperature (catalog GPU_SLOWDOWN_TEMP_C) the clocks drop by half: nvidia-smi(1) says HW
#: thermal slowdown "reduc[es] the core clocks by a factor of 2 or more" (clocks_event_reasons.hw_thermal_slowdown).
THERMAL_SLOWDOWN_CLOCK_FACTOR = 0.5


class GpuPhysics:
    """Per GPU (rows in the cluster's GPU order): spec numbers, the cooling, and the temperature."""

    def __init__(self, gpus: Sequence[Gpu], cooling: Cooling) -> None:
        self.tdp = np.array([g.spec.tdp_w for g in gpus])
        self.idle_w = np.array([g.spec.idle_power_w for g in gpus])
        self.hbm_mib = np.array([g.spec.hbm_bytes / 1024**2 for g in gpus])
        self.sm_max = np.array([SM_CLOCK_MAX_MHZ.get(g.spec.key, np.nan) for g in gpus])
        self.slowdown_c = np.array([GPU_SLOWDOWN_TEMP_C.get(g.spec.key, np.nan) for g in gpus])
        self.inlet_c, self.c_per_w, self.tau_s = cooling.inlet_c, cooling.spec.c_per_w, cooling.spec.tau_s
        self.temp = np.full(len(gpus), self.inlet_c + self.c_per_w * self.idle_w)

    def write(
        self,
        f: np.ndarray,
        dt: float,
        *,
        busy: np.ndarray,
        util: np.ndarray,
        tensor: np.ndarray,
        fb_frac: np.ndarray,
        z: np.ndarray,
    ) -> None:
        """Write one tick of ``dt`` into the fields ``f`` (GPUs x ``DCGM_FIELDS``): the utilisation and
        tensor activity given, and the power, memory, temperature and clocks they make, from the normal
        draws ``z`` (5 x GPUs: rows 1-4 are power, memory, clock and temperature noise). XID errors: 0."""
        f[:, FIELD[vocab.DCGM_FI_DEV_GPU_UTIL]] = util
        f[:, FIELD[vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE]] = np.round(tensor, 6)
        activity = (util / 100.0) * (0.55 + 0.45 * np.minimum(tensor / 0.62, 1.0))
        power = self.idle_w + (self.tdp - self.idle_w) * (0.05 * busy + 0.92 * activity) + 2.0 * z[1]
        power = np.round(np.clip(power, 0.9 * self.idle_w, self.tdp), 3)
        f[:, FIELD[vocab.DCGM_FI_DEV_POWER_USAGE]] = power
        fb = np.round(np.clip(fb_frac * self.hbm_mib * (1 + 0.002 * z[2]), 0, self.hbm_mib))
        f[:, FIELD[vocab.DCGM_FI_DEV_FB_USED]] = fb
        f[:, FIELD[vocab.DCGM_FI_DEV_FB_FREE]] = np.round(self.hbm_mib - fb)
        target = self.inlet_c + self.c_per_w * power
        # At t0 the GPUs have been at their load for a while: start at the steady temperature.
        lag = np.exp(-dt / self.tau_s) if dt > 0 else 0.0
        self.temp = target + (self.temp - target) * lag + 0.3 * z[4]
        f[:, FIELD[vocab.DCGM_FI_DEV_GPU_TEMP]] = np.round(self.temp)
        throttled = busy & (power >= POWER_THROTTLE_FRACTION * self.tdp)
        clock = np.where(
            busy,
            self.sm_max - throttled * np.round(np.abs(z[3]) * 8) * 15.0,
            np.minimum(SM_CLOCK_IDLE_MHZ, self.sm_max),
        )
        too_hot = self.temp >= self.slowdown_c  # NaN (unknown GPU) is never too hot
        f[:, FIELD[vocab.DCGM_FI_DEV_SM_CLOCK]] = np.where(
            too_hot, np.round(clock * THERMAL_SLOWDOWN_CLOCK_FACTOR), clock
        )
        f[:, FIELD[vocab.DCGM_FI_DEV_XID_ERRORS]] = 0.0
