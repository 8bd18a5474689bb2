"""The shuffler's rules as a pure state machine: what the shuffling bridge decides.

Owns the round window, the admission of reports and the release of whole rounds in
shuffled batches (:class:`~broker.core.machine.ShufflerCore`), the effects that record every
change of its state (:mod:`broker.core.effects`), the state itself in packed arrays
(:mod:`broker.core.state`), and the configuration and injected randomness
(:mod:`broker.core.rules`).

May import: the standard library's pure modules, numpy, and the pure parts of ``edge`` (the
codec, the rounds). Never :mod:`broker.store` or :mod:`broker.service`, nor anything that
does I/O, networking, MQTT, metrics or logging (tests/test_layers.py): the time, the
reports and the randomness come in as arguments, and effects go out as values.
"""
