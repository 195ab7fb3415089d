"""defer_scalar: straight to the message hub without a queue (mmengine's update_scalar); with
one, nothing is read until the flush, which gives what .item() gives, in order."""
import uuid

import pytest
import torch
from mmengine.logging import MessageHub

from redet_plugin.utils.deferred_scalars import attach_queue, defer_scalar, detach_queue
from tests.test_engine._read_guard import ReadGuard, guarded, reads_allowed


@pytest.fixture
def hub():
    return MessageHub.get_instance(f'defer-test-{uuid.uuid4().hex}')


def _history(hub, key):
    return hub.get_scalar(key).data[0].tolist()


def test_without_a_queue_the_hub_is_updated_at_once(hub):
    defer_scalar('train/grad_norm', torch.tensor(2.5), message_hub=hub)
    assert _history(hub, 'train/grad_norm') == [2.5]
    with reads_allowed(False), pytest.raises(AssertionError, match='a value was read'):
        defer_scalar('train/grad_norm', guarded(1.0), message_hub=hub)


def test_the_current_hub_is_the_default():
    hub = MessageHub.get_instance(f'defer-test-{uuid.uuid4().hex}')  # (now the current one)
    defer_scalar('train/x', torch.tensor(1.0))
    assert _history(hub, 'train/x') == [1.0]


def test_queued_values_are_read_at_the_flush_one_transfer_per_dtype(hub):
    queue = attach_queue(hub)
    values = [('train/a', guarded(1.1)), ('train/n', guarded(3, torch.int64)),
              ('train/a', guarded(2.2)), ('train/h', guarded(0.1, torch.bfloat16)),
              ('train/a', 7)]  # (a number behind its key's waiting values keeps its place)
    with reads_allowed(False):
        for key, value in values:
            defer_scalar(key, value, message_hub=hub)
        assert len(queue) == 5 and 'train/a' not in hub.log_scalars
    with reads_allowed():
        queue.flush()
    assert ReadGuard.reads == 3  # float32, int64, bfloat16
    assert _history(hub, 'train/a') == [torch.tensor(1.1).item(), torch.tensor(2.2).item(), 7]
    assert _history(hub, 'train/n') == [3] and hub.get_scalar('train/n').data[0].dtype.kind == 'i'
    assert _history(hub, 'train/h') == [torch.tensor(0.1, dtype=torch.bfloat16).item()]
    assert list(hub.log_scalars) == ['train/a', 'train/n', 'train/h']  # (created in order)
    detach_queue(hub)


def test_a_number_for_a_known_key_with_nothing_waiting_goes_at_once(hub):
    hub.update_scalar('train/b', 1)
    queue = attach_queue(hub)
    defer_scalar('train/a', torch.tensor(1.0), message_hub=hub)
    defer_scalar('train/b', 2, message_hub=hub)
    assert len(queue) == 1 and _history(hub, 'train/b') == [1, 2]
    detach_queue(hub)  # flushes what waits; later values go straight to the hub
    defer_scalar('train/a', torch.tensor(3.0), message_hub=hub)
    assert _history(hub, 'train/a') == [1.0, 3.0]


def test_a_tensor_of_several_values_is_refused_when_recorded(hub):
    attach_queue(hub)
    with pytest.raises(ValueError, match=r'train/a: .* one element, got shape \(2,\)'):
        defer_scalar('train/a', torch.ones(2), message_hub=hub)
    detach_queue(hub)


def test_refused_during_a_cuda_graph_capture(hub, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: True)
    with pytest.raises(RuntimeError, match='during a CUDA graph capture'):
        defer_scalar('train/grad_norm', torch.tensor(1.0), message_hub=hub)


def test_a_deferred_read_is_called_at_the_flush_after_the_hubs_updates(hub):
    from redet_plugin.utils.deferred_scalars import defer_read, flush_queue
    read = []
    defer_read(torch.tensor(2.0), read.append, message_hub=hub)  # (no queue: at once)
    assert read == [2.0]
    attach_queue(hub)

    def reader(number):  # (sees the hub already updated, then stops whoever flushed)
        read.append((number, _history(hub, 'train/a')))
        raise RuntimeError('stop')

    with reads_allowed(False):
        defer_read(guarded(1.0), read.append, message_hub=hub)
        defer_scalar('train/a', guarded(5.0), message_hub=hub)
        defer_read(guarded(0.0), reader, message_hub=hub)
        assert read == [2.0]
    with reads_allowed(), pytest.raises(RuntimeError, match='stop'):
        flush_queue(hub)
    assert read == [2.0, 1.0, (0.0, [5.0])]
    assert ReadGuard.reads == 1  # (one transfer for the three)
    detach_queue(hub)
    flush_queue(hub)  # (no queue: nothing to do)
