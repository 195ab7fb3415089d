"""Random draws of a data pipeline that depend on the sample's place in the training stream, not
on the process that prepares it.

A pipeline's augmentations (flips, rotations) draw from the global `random`, numpy and torch
generators of whatever process runs them: the main process with num_workers=0, else a loader
worker, whose generators are seeded when it starts. A resumed run starts new workers, so without
more its augmentations would differ from those of the run it continues.

The train loops (redet_plugin/engine/resumable_loops.py) hand the data set `DrawIndex`es: the
sample's index with a seed made from (sampler seed, rank, pass, batch, place in the batch). The
data sets of this package run the pipeline of such an index with the three generators seeded
from it (`seeded_draws`) and put back as they were afterwards, so that the draws of the main
process (the model's samplers) do not depend on the data either.
"""
import contextlib
import random
from typing import Iterator, Sequence

import numpy as np
import torch


class DrawIndex(int):
    """A data set index with the seed of its pipeline's random draws (`.seed`)."""

    def __new__(cls, index: int, seed: int) -> 'DrawIndex':
        obj = super().__new__(cls, index)
        obj.seed = int(seed)
        return obj

    def __reduce__(self):  # to loader workers
        return (DrawIndex, (int(self), self.seed))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return f'DrawIndex({int(self)}, seed={self.seed})'


def draw_seed(numbers: Sequence[int]) -> int:
    """A 32-bit seed mixed from non-negative integers (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(n) for n in numbers]).generate_state(1)[0])


@contextlib.contextmanager
def seeded_draws(seed: int) -> Iterator[None]:
    """Seeds Python's `random`, numpy's global and torch's CPU generator from `seed`; puts their
    states back on leaving."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)  # (the CPU generator only: pipelines run there)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
