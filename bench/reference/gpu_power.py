"""The GPU's mean power while a PyTorch reference keeps training after its timed steps: the rule of
bench/support/power.cuh (the dpml benches'), so both print power_w and a throughput per joule.

NVML (libnvidia-ml.so.1) through ctypes, no package needed: the GPU torch uses is found by its PCI
address. Its energy counter (it moves in ~100 ms steps on H100/H200) is read after a step when at
least 0.1 s have passed since the last read; the mean power is the counter's between its first and
last moves within the phase's last `seconds − 1` (at least 1 s), as nvml::PowerMeter averages. Where
the GPU has no counter, NVML's power reading at the end. Under torch.distributed each rank meters its
own GPU and the ranks' means are summed. None where NVML or any rank's GPU gives no reading.
"""
import ctypes
import math
import sys
import time

import torch
import torch.distributed as dist


def _nvml_device():
    """(library, handle) of torch's current GPU, or (None, why)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return None, f"no NVML ({e})"
    if lib.nvmlInit_v2() != 0:
        return None, "nvmlInit_v2 failed"
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    handle = ctypes.c_void_p()
    try:
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle))
    except AttributeError:  # a torch without the PCI fields: by UUID
        bus = f"GPU-{p.uuid}"
        rc = lib.nvmlDeviceGetHandleByUUID(bus.encode(), ctypes.byref(handle))
    if rc != 0:
        return None, f"NVML does not name the GPU at {bus} (error {rc})"
    return (lib, handle), None


def _energy_j(nvml):
    lib, handle = nvml
    mj = ctypes.c_ulonglong()
    return mj.value * 1e-3 if lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj)) == 0 else None


def _power_w(nvml):
    lib, handle = nvml
    mw = ctypes.c_uint()
    return mw.value * 1e-3 if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(mw)) == 0 else None


def add_energy_flag(parser):
    """--energy-seconds, as the dpml benches take it."""
    parser.add_argument("--energy-seconds", type=float, default=3.0,
                        help="after the timed steps, train this long more to meter the GPUs' power (0: not measured)")


def mean_power_w(step, seconds, ms_per_step):
    """Runs step() and a device sync ceil(seconds / ms_per_step) times (the same count on every rank:
    ms_per_step is the slowest rank's) and returns the summed mean power in watts of the ranks' GPUs,
    or None (seconds <= 0: nothing runs)."""
    if seconds <= 0:
        return None
    nvml, why = _nvml_device()
    window = max(1.0, seconds - 1.0)
    ticks, last_j, last_read = [], None, None  # ticks: (time, joules) where the counter had moved
    if nvml:
        last_j = _energy_j(nvml)
    for _ in range(max(1, math.ceil(seconds * 1e3 / ms_per_step))):
        step()
        torch.cuda.synchronize()
        now = time.monotonic()
        if nvml and last_j is not None and (last_read is None or now - last_read >= 0.1):
            last_read = now
            j = _energy_j(nvml)
            if j is not None and j != last_j:
                ticks.append((now, j))
                while len(ticks) > 2 and ticks[1][0] <= now - window:
                    ticks.pop(0)
            last_j = j
    watts = None
    if nvml:
        if len(ticks) >= 2:
            watts = (ticks[-1][1] - ticks[0][1]) / (ticks[-1][0] - ticks[0][0])
        else:
            watts = _power_w(nvml)
        if watts is None:
            why = "the GPU reports neither energy nor power"
    if dist.is_available() and dist.is_initialized():
        t = torch.tensor([watts or 0.0, 0.0 if watts is not None else 1.0], device="cuda", dtype=torch.float64)
        dist.all_reduce(t)
        watts = t[0].item() if t[1].item() == 0 else None
    if watts is None and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"power not measured: {why or 'a rank gives no reading'}", file=sys.stderr)
    return watts


def per_joule(rate, watts, digits=2):
    """rate (samples or tokens per second) per joule, None where the power is not known."""
    return round(rate / watts, digits) if watts else None
