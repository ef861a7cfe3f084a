"""Per-node system sampler: GPU utilisation and memory through NVML, else CPU and memory.

One per node (the reporter of LOCAL_RANK 0 reads it, on its own thread, once a heartbeat
interval), so N ranks on a node do not report the same devices N times. Values are
fractions in [0, 1].
"""


class _NvmlSource:
    """GPUs via NVML. Initialised once; a field a device refuses (utilisation under MIG,
    for one) is left out of that device's sample instead of failing the sample."""

    def __init__(self):
        import pynvml  # nvidia-ml-py; absent on CPU-only hosts

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                        for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("NVML sees no GPU")

    def sample(self):
        samples = []
        for index, handle in enumerate(self.handles):
            values = {}
            try:
                values["gpu_util"] = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            except self.nvml.NVMLError:
                pass
            try:
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                values["gpu_mem"] = memory.used / memory.total
            except self.nvml.NVMLError:
                pass
            if values:
                samples.append((f"gpu{index}", values))
        return samples


class _CpuSource:
    """Whole-host CPU busy fraction since the previous sample, and memory in use; psutil
    when installed, else /proc."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self.psutil = psutil
        self.last_cpu_times = None
        self._cpu_util()  # the first reading only sets the baseline

    def sample(self):
        values = {"mem_used": self._mem_used()}
        cpu_util = self._cpu_util()
        if cpu_util is not None:
            values["cpu_util"] = cpu_util
        return [("cpu", values)]

    def _cpu_util(self):
        if self.psutil:
            return self.psutil.cpu_percent(interval=None) / 100
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle, total = fields[3] + fields[4], sum(fields)  # idle + iowait
        previous, self.last_cpu_times = self.last_cpu_times, (idle, total)
        if previous is None or total == previous[1]:
            return None
        return 1 - (idle - previous[0]) / (total - previous[1])

    def _mem_used(self):
        if self.psutil:
            return self.psutil.virtual_memory().percent / 100
        meminfo = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, value = line.split(":", 1)
                meminfo[name] = int(value.split()[0])
        return 1 - meminfo["MemAvailable"] / meminfo["MemTotal"]


def open_source():
    try:
        return _NvmlSource()
    except Exception:  # no pynvml, no driver, no GPU: NVML fails in many ways
        return _CpuSource()
