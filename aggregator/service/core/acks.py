"""Which deliveries may be acknowledged, by checkpoint generation (no I/O).

A delivered batch is acknowledged to the broker only once *two* durable checkpoint
generations hold it: the PUBACKs of the batches in generation ``N`` are sent once
generation ``N + 1`` is durable. If the newest file is found damaged, recovery falls back
to the previous generation, and every batch it lacks is one the broker still holds
unacknowledged and redelivers: nothing lost, nothing doubled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["AckGenerations"]

T = TypeVar("T")


class AckGenerations(Generic[T]):
    """Which deliveries may be acknowledged, by checkpoint generation (module docs).

    ``T`` is whatever the shell needs to send a PUBACK (a connection and a message id).
    A delivery is *open* until a checkpoint snapshot covers it, then *writing* until that
    generation is durable, then *held* until the next generation is durable, when
    :meth:`written` hands it out to be acknowledged.
    """

    def __init__(self) -> None:
        self.open: list[T] = []
        self.writing: list[T] = []
        self.held: list[T] = []
        self.newest_unacknowledged = False
        """Whether the newest durable generation holds deliveries never acknowledged (kept
        when a lost connection drops them): a service whose session was taken over rolls
        its files back to the previous generation, so that the new holder, to whom the
        broker redelivers them, is the only one to count them."""

    def __len__(self) -> int:
        return len(self.open) + len(self.writing) + len(self.held)

    def delivered(self, token: T) -> None:
        self.open.append(token)

    def snapshot(self) -> None:
        """A checkpoint snapshot was taken: what is open goes into that generation."""
        self.writing.extend(self.open)
        self.open = []

    def written(self) -> list[T]:
        """The snapshot's generation is durable: return what the previous generation held
        (acknowledge it now); the new one's deliveries wait for the next generation."""
        ready, self.held, self.writing = self.held, self.writing, []
        self.newest_unacknowledged = bool(self.held)
        return ready

    def failed(self) -> None:
        """The snapshot's generation could not be written: its deliveries are open again."""
        self.open = self.writing + self.open
        self.writing = []

    def drop(self, lost: Callable[[T], bool]) -> int:
        """Forget the deliveries for which ``lost`` holds (their connection is gone: the
        broker redelivers them); how many."""
        count = 0
        for name in ("open", "writing", "held"):
            tokens: list[T] = getattr(self, name)
            kept = [t for t in tokens if not lost(t)]
            count += len(tokens) - len(kept)
            setattr(self, name, kept)
        return count

    def take_all(self) -> list[T]:
        """Everything, to acknowledge at once (a service without checkpoints)."""
        every, self.open, self.writing, self.held = self.held + self.writing + self.open, [], [], []
        return every

    def waiting(self) -> bool:
        """Whether a new generation would let PUBACKs out."""
        return bool(self.held or self.writing or self.open)
