"""The shuffler's rules as a pure state machine: what the shuffling bridge decides.

Owns the round window and the admission of reports (:mod:`broker.core.admission`), the
release of whole rounds in shuffled batches (:mod:`broker.core.release`), the effects that
record every change of state (:mod:`broker.core.effects`) and their folding into the state
(:mod:`broker.core.machine`: :class:`~broker.core.machine.ShufflerCore`, the one object the
shell drives), the state itself in packed arrays (:mod:`broker.core.state`), and the
configuration and injected randomness (:mod:`broker.core.rules`).

May import: the standard library's pure modules, numpy, and the pure parts of ``edge`` (the
codec, the rounds). Never :mod:`broker.store` or :mod:`broker.service`, nor anything that
does I/O, networking, MQTT, metrics or logging (tests/test_layers.py): the time, the
reports and the randomness come in as arguments, and effects go out as values.

Invariants (property-tested in tests/broker/test_core.py)
---------------------------------------------------------
1. No batch holds fewer than ``min_batch`` records.
2. No batch holds two reports whose tokens are equal (one device, one report per batch):
   a device has at most one report per round (``duplicate_in_round``), and where carried
   reports meet a report of the same device, the newest one wins and the others are
   counted as dropped (``carry_superseded``) when the pool leaves. A release checks it.
3. Every accepted report is released exactly once or counted as dropped with a reason.
"""
