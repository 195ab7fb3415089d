"""Scalars of a training iteration recorded on the device and read back later, in one transfer.

mmengine's MessageHub.update_scalar turns a tensor into a Python number at once (`.item()`): on a
GPU the host then waits for all queued work, once per logged value per iteration. A message hub
that a RedetRuntimeInfoHook runs for has a `ScalarQueue` instead: values wait in it, and the hook
flushes it (one read-back per dtype and device) where something reads the histories, i.e. where
the LoggerHook logs, before validation, checkpoints and the end of training. The histories then
hold what update_scalar would have put there, in the same order.

    defer_scalar('train/grad_norm', norm)   # e.g. after a captured step's replay

With no RedetRuntimeInfoHook (no queue on the hub) defer_scalar is mmengine's update_scalar.

A value that is not a logged scalar but decides what to do is read the same way:

    defer_read(flag, on_read)   # on_read(number) at the flush, after the hub's updates

(RedetNonFiniteStepsHook reads each training step's non-finite flag so.)

A helper of the low layer (utils/), not of engine/: it needs only mmengine's MessageHub, and its
writers sit in several layers: the captured training step (cuda_graphs/) logs the gradient norm
with it, RedetOptimWrapper (engine/) likewise, and RedetRuntimeInfoHook (engine/) attaches and
flushes the queues. It is no data structure (structures/), so it lives among the shared helpers.
"""
from typing import Callable, List, Optional, Tuple, Union
from weakref import WeakKeyDictionary, ref

import torch
from mmengine.logging import MessageHub

__all__ = ['defer_read', 'defer_scalar', 'ScalarQueue', 'attach_queue', 'detach_queue',
           'flush_queue']

# one queue per message hub (weak: a hub dropped by its runner takes its queue with it)
_QUEUES: 'WeakKeyDictionary[MessageHub, ScalarQueue]' = WeakKeyDictionary()


class ScalarQueue:
    """The values waiting for one message hub, in the order they came."""

    def __init__(self, hub: MessageHub):
        self._hub = ref(hub)  # (a strong one would keep the hub, the key of _QUEUES, alive)
        # (message hub key or on_read callable, value)
        self._entries: List[Tuple[Union[str, Callable], object]] = []
        self._keys = set()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hub(self) -> MessageHub:
        return self._hub()

    def add(self, key: str, value) -> None:
        if not isinstance(value, torch.Tensor):
            # at once, unless it would overtake a waiting value of its key, or create its
            # history before those of waiting keys
            if key not in self._keys and (key in self.hub.log_scalars or not self._entries):
                self.hub.update_scalar(key, value)
                return
        elif value.numel() != 1:  # (update_scalar's check, made now: numel reads no value)
            raise ValueError(f'{key}: a logged scalar must have one element, got shape '
                             f'{tuple(value.shape)}')
        else:
            # not copied: the caller keeps the tensor unchanged until it is read (a captured
            # graph's outputs are cloned by the caller); detached, so no autograd graph is kept
            value = value.detach()
        self._entries.append((key, value))
        self._keys.add(key)

    def add_read(self, value: torch.Tensor, on_read: Callable[[float], None]) -> None:
        """Reads `value` (one element) at the flush and calls on_read(number) then."""
        if value.numel() != 1:
            raise ValueError(f'defer_read: the value must have one element, got shape '
                             f'{tuple(value.shape)}')
        self._entries.append((on_read, value.detach()))

    def has_new_keys(self) -> bool:
        """Whether a waiting key is not in the hub yet: flushing now keeps the order in which
        the hub's histories were created (the order of the logged values on a log line)."""
        return any(key not in self.hub.log_scalars for key in self._keys)

    def flush(self) -> None:
        """Reads all waiting tensors back (one transfer per dtype and device) and updates the
        hub with every waiting value, in order."""
        if not self._entries:
            return
        groups = {}
        for index, (_, value) in enumerate(self._entries):
            if isinstance(value, torch.Tensor):
                groups.setdefault((value.device, value.dtype), []).append(index)
        numbers = [value for _, value in self._entries]
        for indices in groups.values():
            stacked = torch.stack([self._entries[i][1].reshape(()) for i in indices])
            for i, number in zip(indices, stacked.tolist()):  # (what .item() gives, at once)
                numbers[i] = number
        entries, self._entries, self._keys = self._entries, [], set()
        reads = []
        for (key, _), number in zip(entries, numbers):
            if callable(key):
                reads.append((key, number))
            else:
                self.hub.update_scalar(key, number)
        # after the hub's updates: a reader may raise (e.g. to stop the run), and the histories
        # are then whole
        for on_read, number in reads:
            on_read(number)


def attach_queue(hub: MessageHub) -> ScalarQueue:
    """The hub's queue (made on the first call): its scalars wait until it is flushed."""
    if hub not in _QUEUES:
        _QUEUES[hub] = ScalarQueue(hub)
    return _QUEUES[hub]


def detach_queue(hub: MessageHub) -> None:
    """Flushes the hub's queue and removes it: later scalars go straight to the hub."""
    queue = _QUEUES.pop(hub, None)
    if queue is not None:
        queue.flush()


def defer_scalar(key: str, value, message_hub: Optional[MessageHub] = None) -> None:
    """Records `value` (a one-element tensor, or a number) under `key` (a message hub key,
    e.g. 'train/grad_norm') without reading it.

    message_hub: the hub to update (default: MessageHub.get_current_instance(), the runner's).
    The tensor is kept as given until the queue is flushed: nothing may write into it before
    (pass a copy of a buffer that is reused, e.g. of a CUDA graph's output). Not allowed during
    a CUDA graph capture: the value would be a placeholder that only replays fill.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f'defer_scalar({key!r}) during a CUDA graph capture: call it after '
                           'the replay, with a copy of the value')
    hub = message_hub if message_hub is not None else MessageHub.get_current_instance()
    queue = _QUEUES.get(hub)
    if queue is None:
        hub.update_scalar(key, value)
    else:
        queue.add(key, value)


def defer_read(value: torch.Tensor, on_read: Callable[[float], None],
               message_hub: Optional[MessageHub] = None) -> None:
    """Calls on_read(number) with `value` (a one-element tensor) read back at the hub's next
    flush, in order with the deferred scalars (at once where the hub has no queue). The rules
    of defer_scalar hold: the tensor is kept as given, and not during a capture."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError('defer_read during a CUDA graph capture: call it after the replay, '
                           'with a copy of the value')
    hub = message_hub if message_hub is not None else MessageHub.get_current_instance()
    queue = _QUEUES.get(hub)
    if queue is None:
        on_read(value.item())
    else:
        queue.add_read(value, on_read)


def flush_queue(message_hub: Optional[MessageHub] = None) -> None:
    """Reads back now what waits in the hub's queue (nothing where it has none)."""
    hub = message_hub if message_hub is not None else MessageHub.get_current_instance()
    queue = _QUEUES.get(hub)
    if queue is not None:
        queue.flush()
