"""ResumableDistributedSampler: DistributedSampler that remembers where it is in an epoch.

The position is the number of indices this rank's iterator has yielded in the current
epoch. With a DataLoader of num_workers=0 that is exactly the samples consumed, so a
checkpoint taken after batch k resumes at batch k + 1. With workers, the loader prefetches
(num_workers * prefetch_factor batches) and the position runs ahead by that much: a resumed
run would skip those batches.

For a bitwise-identical resume, give the DataLoader its own generator
(`DataLoader(..., generator=torch.Generator())`): otherwise each new loader iterator draws a
seed from the global torch RNG, and a resumed run, which starts a fresh iterator mid-epoch,
draws once more than the run it continues.
"""

import math

import torch
import torch.distributed as dist
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler):
    """Same order as torch's DistributedSampler (same seed, epoch, padding and drop_last
    rules), plus state_dict()/load_state_dict() of (epoch, position).

    Call set_epoch(epoch) at the start of every epoch, as with DistributedSampler. A new
    epoch starts at position 0; set_epoch with the current epoch (as a resumed loop does)
    keeps the restored position, so the epoch continues where it was saved.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        self.dataset_len = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        if drop_last and self.dataset_len % num_replicas:
            self.num_samples = math.ceil((self.dataset_len - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(self.dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.epoch = 0
        self.position = 0
        # Samples of this epoch's order consumed before this world took over (a branch to
        # another world size); 0 otherwise. The rest of the epoch is shared out from there.
        self.offset = 0

    def __len__(self):
        if not self.offset:
            return self.num_samples
        rest = max(self.dataset_len - self.offset, 0)
        return rest // self.num_replicas if self.drop_last else math.ceil(rest / self.num_replicas)

    def set_epoch(self, epoch):
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0
            self.offset = 0

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position, "replicas": self.num_replicas,
                "offset": self.offset}

    def load_state_dict(self, state):
        """Restore (epoch, position). Saved by another number of replicas (a DDP job branched
        to another world size), the epoch goes on from the global position: every replica had
        taken `position` samples in turn, so the first offset + position x replicas of the
        epoch's order are consumed, and this world shares out the rest; no sample of the
        epoch is seen twice (the saved world's padding aside)."""
        self.epoch = state["epoch"]
        replicas = state.get("replicas", self.num_replicas)
        offset = state.get("offset", 0)
        if replicas == self.num_replicas:
            self.position, self.offset = state["position"], offset
        else:
            self.position = 0
            self.offset = min(offset + state["position"] * replicas, self.dataset_len)

    def __iter__(self):
        indices = self._epoch_indices()
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index

    def _epoch_indices(self):
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.dataset_len, generator=generator).tolist()
        else:
            indices = list(range(self.dataset_len))
        if self.offset:
            rest = indices[self.offset:]
            if self.drop_last:
                rest = rest[:len(rest) - len(rest) % self.num_replicas]
            elif rest:
                padding = -len(rest) % self.num_replicas
                rest += (rest * math.ceil(padding / len(rest)))[:padding]
            return rest[self.rank::self.num_replicas]
        if self.drop_last:
            indices = indices[:self.total_size]
        else:
            padding = self.total_size - len(indices)
            indices += (indices * math.ceil(padding / len(indices)))[:padding]
        return indices[self.rank:self.total_size:self.num_replicas]
