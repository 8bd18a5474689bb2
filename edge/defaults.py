"""The defaults every ``coco`` command shares, in one place (pure: no imports).

- **Round length**: :data:`DEFAULT_ROUND_SECONDS` (60 s) is what ``coco announce`` announces
  without ``--round-seconds``; the shuffler, the aggregator and the fleet take the announced
  length, so a deployment has one length whatever its commands were given.
- **Metrics address**: every service binds its HTTP endpoints to
  :data:`DEFAULT_METRICS_HOST` (127.0.0.1, the host's loopback) unless ``--metrics-host``
  says otherwise; a container that Prometheus scrapes over a network passes
  ``--metrics-host 0.0.0.0`` (compose.yaml does).
- **Metrics ports**: one per service, those of compose.yaml and
  deploy/prometheus/prometheus.yml: the aggregator :data:`AGGREGATOR_METRICS_PORT` (always
  served: it also serves ``/estimates``), the shuffler :data:`SHUFFLER_METRICS_PORT` and the
  fleet :data:`FLEET_METRICS_PORT` (served when ``--metrics-port`` is given).
- **delta**: every option that takes a target delta accepts it in ``(0, 1)`` alone
  (:func:`check_delta`); a delta of 1 bounds nothing.
"""

from __future__ import annotations

DEFAULT_ROUND_SECONDS = 60
"""The announced round length without ``--round-seconds`` (1,440 rounds a day)."""

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where every service's ``/metrics`` (and the aggregator's ``/estimates``) listens by
default: the loopback, so nothing is exposed beyond the host unless asked for."""

AGGREGATOR_METRICS_PORT = 9108
SHUFFLER_METRICS_PORT = 9109
FLEET_METRICS_PORT = 9110

DELTA_RANGE = "(0, 1)"
"""The range of every target delta, as the messages write it."""


def check_delta(delta: float) -> float:
    """``delta`` if it is in ``(0, 1)``; :class:`ValueError` naming it otherwise (NaN too)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in {DELTA_RANGE}, got {delta}")
    return delta
