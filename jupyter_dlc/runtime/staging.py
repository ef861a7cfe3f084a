"""Copy training state into host memory on the training thread: the only stall of a save.

Host buffers are kept between saves and refilled with `copy_`, so a steady-state save costs
one memcpy per tensor and no allocation (fresh buffers would page-fault their way in every
time). GPU tensors go to pinned buffers with non-blocking copies; the returned CUDA event
marks when they have landed, so the training thread does not wait for the transfer either:
later kernels on the same stream cannot overtake the copies, and the persisting thread
waits on the event before reading.
"""

import copy
from collections import OrderedDict

import torch


class HostStaging:
    def __init__(self):
        self._buffers = {}  # path in the state tree -> host tensor

    def stage(self, state):
        """Returns (host copy of state, CUDA event to wait on or None)."""
        self._saw_cuda = False
        staged = self._copy(state, ())
        ready = None
        if self._saw_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return staged, ready

    def _copy(self, value, path):
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value, path)
        if type(value) in (dict, OrderedDict):
            staged = type(value)((key, self._copy(item, path + (key,)))
                                 for key, item in value.items())
            if hasattr(value, "_metadata"):  # module state_dict versions, read on load
                staged._metadata = copy.deepcopy(value._metadata)
            return staged
        if type(value) in (list, tuple):
            return type(value)(self._copy(item, path + (i,)) for i, item in enumerate(value))
        # Step counters, lrs, RNG tuples; and containers of unknown kind, copied whole.
        return copy.deepcopy(value)

    def _copy_tensor(self, tensor, path):
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                 pin_memory=tensor.is_cuda)
            self._buffers[path] = buffer
        buffer.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
        self._saw_cuda = self._saw_cuda or tensor.is_cuda
        return buffer
