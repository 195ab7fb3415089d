"""DistributedStep (redet_plugin/cuda_graphs/distributed_step.py) in two gloo processes on the
CPU: its gradients are DDP's, and GraphCache.graph_for with its agreement makes the processes
capture together, replay together and run eagerly together. The captured step itself needs a
GPU: tests/test_cuda_graphs/test_captured_training.py runs it under DDP with NCCL."""
import gc
import multiprocessing
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn

from redet_plugin.cuda_graphs.distributed_step import DistributedStep
from redet_plugin.cuda_graphs.graph_cache import GraphCache
from tests._helpers import free_port

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason='needs torch.distributed with gloo')
WORLD_SIZE = 2
TIMEOUT_S = 120



def _process(check, rank, port, errors):
    try:
        dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                                world_size=WORLD_SIZE)
        try:
            check(rank)
        finally:
            gc.collect()  # a DDP wrapper left alive holds the group past its destruction
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        errors.put(f'rank {rank}:\n{traceback.format_exc()}')


def run_processes(check):
    """check(rank) in WORLD_SIZE spawned processes of one gloo group; their errors raised."""
    context = multiprocessing.get_context('spawn')
    errors, port = context.Queue(), free_port()
    processes = [context.Process(target=_process, args=(check, rank, port, errors))
                 for rank in range(WORLD_SIZE)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(TIMEOUT_S)
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    assert not reports, '\n'.join(reports)
    assert not alive, 'a process hung (the processes disagreed on a collective)'
    assert [p.exitcode for p in processes] == [0] * WORLD_SIZE


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        self.unused = nn.Linear(2, 2)  # no gradient in any process: DDP leaves it None
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        y = self.norm(self.conv(x) * self.frozen.sum()).relu().mean((2, 3))
        return self.head(y).square().sum()


def _net():
    torch.manual_seed(0)
    return _Net().double().to(memory_format=torch.channels_last)


def _inputs(rank):
    generator = torch.Generator().manual_seed(10 + rank)
    return torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=generator)


def _check_gradients(rank):
    x = _inputs(rank)
    reference = nn.parallel.DistributedDataParallel(_net(), find_unused_parameters=True)
    reference(x).backward()
    net = _net()
    step = DistributedStep()
    step.backward(step.forward(net, x=x))
    expected = dict(reference.module.named_parameters())
    for name, p in net.named_parameters():
        if expected[name].grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, expected[name].grad, rtol=1e-12, atol=1e-12,
                                   msg=lambda m, name=name: f'{name}: {m}')
        assert p.grad.stride() == p.stride(), name
    assert net.unused.weight.grad is None and net.conv.weight.grad is not None
    # the processes' inputs differ: an average that left one out would differ from DDP's
    local = _net()
    local(x).backward()
    assert not torch.allclose(local.conv.weight.grad, net.conv.weight.grad)


def test_gradients_are_ddps_average():
    run_processes(_check_gradients)


class _Graphs(GraphCache):
    shared_pool = False  # (a pool handle needs CUDA; these graphs are stand-ins)


def _calls(graphs, step, key, n, warmup, make):
    results = []
    for _ in range(n):
        graph = graphs.graph_for(key, (), lambda: (), warmup, 'layouts', 'a step', make,
                                 agree=lambda action: step.agree_action(action, key))
        results.append(graph)
    return results


def _check_agreement(rank):
    step = DistributedStep()
    # rank 1 needs more warm-up: both capture at rank 1's turn, in the same call
    captures = []
    graphs = _Graphs(max_graphs=4)

    def make(pool):
        captures.append(len(captures))
        return f'graph of rank {rank}'

    results = _calls(graphs, step, ('layout', 1), 5, 1 + 2 * rank, make)
    assert results == [None] * 3 + [f'graph of rank {rank}'] * 2, results
    assert captures == [0]
    # layouts that differ between the processes: eager in both, said once
    different = _calls(graphs, step, ('layout', 2 + rank), 3, 0, make)
    assert different == [None] * 3 and step.mismatch and captures == [0]
    # a capture that fails in one process: no process keeps its graph, all are marked failed
    failing = _Graphs(max_graphs=4)

    def fail_on_rank_1(pool):
        if rank == 1:
            raise RuntimeError('operation not permitted when stream is capturing')
        return 'graph'

    assert _calls(failing, step, ('layout', 1), 3, 0, fail_on_rank_1) == [None] * 3
    assert failing.failed is not None and len(failing) == 0
    # the gt capacity is the largest of the processes'
    assert step.agree_capacity((64 << rank, 32)) == (128, 32)


def test_processes_capture_replay_and_run_eagerly_together():
    run_processes(_check_agreement)
