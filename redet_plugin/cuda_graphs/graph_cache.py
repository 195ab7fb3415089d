"""What FeatureGraphs, StepGraphs and PredictGraphs share: captured graphs by key, their
arguments' checks, copies without graphs, one memory pool for all of them (where their graphs
never interleave), the reason of a failed capture, and one log line per message."""
import logging
import time
from typing import Callable, Optional

import torch
from mmengine.logging import print_log

from ..utils.cuda_capture import failure_reason

__all__ = ["CAPTURE", "EAGER", "REPLAY", "GraphCache"]

# what a call of graph_for does; ordered so that the least of several processes' actions is the
# one they all can take together
EAGER, CAPTURE, REPLAY = 0, 1, 2


class GraphCache:
    """Graphs by key, each stored with the storage key of the tensors it reads in place.

    Subclasses set `option` (the model option's name, for messages) and pass their integer
    arguments (each at least 1) to __init__; a copy of the model (deepcopy for EMA, pickling)
    starts without graphs, which belong to the tensors of this one.
    """

    option = "cuda_graph"
    # one memory pool for all graphs of a cache: they never run at the same time, and nothing one
    # of them leaves behind is read by another. A cache whose graphs may interleave sets False:
    # make() then gets None and gives each graph a pool of its own.
    shared_pool = True

    def __init__(self, **arguments):
        for name, value in arguments.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{self.option}: {name} must be an int >= 1; got {value!r}")
            setattr(self, name, value)
        self.arguments = arguments
        self._graphs = {}  # key -> (storage key, graph)
        self._eager_runs = {}  # warm-up key -> eager calls so far (the warm-up before capture)
        self._said = set()
        self._pool = None
        self.failed: Optional[str] = None
        self.warming_up = False  # whether graph_for's last None was a warm-up call

    def __deepcopy__(self, memo):
        return type(self)(**self.arguments)

    def __getstate__(self):
        return dict(self.arguments)

    def __setstate__(self, state):
        self.__init__(**state)

    def __len__(self):
        return len(self._graphs)

    def say(self, message: str, level: int = logging.WARNING) -> None:
        """Logs `message` once."""
        if message not in self._said:
            self._said.add(message)
            print_log(f"{self.option}: {message}", logger="current", level=level)

    def say_eager(self, reason: str, on_cuda: bool) -> None:
        """Logs once why calls run eagerly: a warning on a GPU; information on the CPU, where
        the eager path is the only one."""
        self.say(f"eager: {reason}", logging.WARNING if on_cuda else logging.INFO)

    def graph_for(self, key, storage: tuple, read_storage: Callable[[], tuple], warmup: int,
                  layouts: str, what: str, make: Callable,
                  on_failure: Callable = lambda: None, warmup_key=None,
                  agree: Optional[Callable[[int], int]] = None):
        """The graph for `key`, or None: run eagerly (`warming_up` then says whether it is one of
        the warm-up calls before a capture). `storage` lists the tensors a graph reads
        in place (one replaced since the capture: captured again); the first `warmup` calls of
        a `warmup_key` (default: `key`) run eagerly, the next one captures (read_storage() is
        taken after the capture, which may have built lazy state); past max_graphs keys, eager
        with one line. Keys that share a warm-up key share its warm-up: the eager steps of a
        new key only grow the eager cache beside the graphs' pool.

        agree: for graphs that hold collectives (several processes, one key for all of them):
        takes this process's action (EAGER, CAPTURE, REPLAY) and gives the least of all the
        processes' actions. NCCL requires a captured collective to be captured by all the
        processes at once and replayed by all from that same capture: so where one process
        runs eagerly all do, where one captures all capture, and where a capture failed in
        any process none keeps its graph."""
        entry = self._graphs.get(key)
        self.warming_up = warming_up = False
        if entry is not None and entry[0] == storage:
            action = REPLAY
        elif entry is None and len(self._graphs) >= self.max_graphs:
            self.say(f"eager: more than max_graphs={self.max_graphs} {layouts}; raise "
                     "max_graphs to capture more")
            action = EAGER
        else:
            warmup_key = key if warmup_key is None else warmup_key
            runs = self._eager_runs.get(warmup_key, 0)
            action = CAPTURE if runs >= warmup else EAGER
            if action == EAGER:
                self._eager_runs[warmup_key] = runs + 1
                warming_up = True
        if agree is not None:
            action = agree(action)
        if action == EAGER:
            self.warming_up = warming_up
            return None
        if action == REPLAY:
            return entry[1]
        graph = self.capture(key, what, make, on_failure)
        if agree is not None and agree(EAGER if graph is None else REPLAY) == EAGER:
            if graph is not None:
                self.failed = "a capture failed in another process"
                self.say(f"eager: {self.failed}")
            return None
        if graph is not None:
            self._graphs[key] = (read_storage(), graph)
        return graph

    def capture(self, key, what: str, make: Callable, on_failure: Callable = lambda: None):
        """`make(pool)` captures a graph for `key`; None where it fails (the reason is logged
        and kept: eager from then on)."""
        self._graphs.pop(key, None)  # (frees a stale graph before capturing its successor)
        if self.shared_pool and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        start = time.perf_counter()
        try:
            graph = make(self._pool)
        except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager
            on_failure()
            self.failed = failure_reason(error)
            self.say(f"eager: {self.failed}")
            return None
        self.say(f"captured {what} ({time.perf_counter() - start:.1f} s)", logging.INFO)
        return graph
