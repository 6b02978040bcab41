"""GPU counters through NVML (``nvidia-ml-py``, NVIDIA's bindings of the NVIDIA Management Library).

Read at scrape time by a custom prometheus_client collector: utilization (nvmlDeviceGetUtilizationRates:
percent of the last sample period in which a kernel ran), memory used/total (nvmlDeviceGetMemoryInfo),
power (nvmlDeviceGetPowerUsage, milliwatts), SM clock (nvmlDeviceGetClockInfo NVML_CLOCK_SM, MHz) and
temperature (nvmlDeviceGetTemperature NVML_TEMPERATURE_GPU, °C); converted to the base units of
``names.METRICS``. On a machine without the library or a GPU the collector reports ``available = False``
and exports nothing: CPU runs skip it cleanly. Reference: NVML API Reference Guide, "Device Queries".
"""

from __future__ import annotations

from shardlab.runtime.observe.names import BY_NAME, COMMON_LABELS


def nvml_handle(index: int):
    """(pynvml module, device handle) or (None, None) when NVML cannot be used here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no package, no driver, no such device
        return None, None


def read_gpu(nv, handle) -> dict[str, float]:
    """One reading in base units; a query the device does not support is left out."""
    out: dict[str, float] = {}
    queries = {
        "shardlab_gpu_utilization_ratio": lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
        "shardlab_gpu_memory_used_bytes": lambda: float(nv.nvmlDeviceGetMemoryInfo(handle).used),
        "shardlab_gpu_memory_total_bytes": lambda: float(nv.nvmlDeviceGetMemoryInfo(handle).total),
        "shardlab_gpu_power_watts": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "shardlab_gpu_sm_clock_hertz": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM) * 1e6,
        "shardlab_gpu_temperature_celsius": lambda: float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
    }
    for name, q in queries.items():
        try:
            out[name] = float(q())
        except Exception:  # NVML_ERROR_NOT_SUPPORTED on some boards (e.g. power on consumer cards)
            continue
    return out


class NvmlCollector:
    """prometheus_client collector of one GPU's NVML readings."""

    def __init__(self, index: int, base_labels: dict[str, str]):
        self.index = index
        self.base = base_labels
        self.nv, self.handle = nvml_handle(index)

    @property
    def available(self) -> bool:
        return self.handle is not None

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        if not self.available:
            return
        labels = list(COMMON_LABELS) + ["gpu"]
        values = [self.base[k] for k in COMMON_LABELS] + [str(self.index)]
        for name, v in read_gpu(self.nv, self.handle).items():
            fam = GaugeMetricFamily(name, BY_NAME[name].help, labels=labels)
            fam.add_metric(values, v)
            yield fam
