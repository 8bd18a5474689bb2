"""``coco fleet``: N simulated devices publishing privatised reports to an MQTT broker
(docs/fleet.md).

What each module owns:

* :mod:`~sim.fleet.run`: :class:`~sim.fleet.run.Fleet`, the rounds loop (what a device
  does each wall-clock round: its vector, its report, its publish);
* :mod:`~sim.fleet.config`: :class:`~sim.fleet.config.FleetConfig`, the choice of the next
  round and the file-descriptor limit;
* :mod:`~sim.fleet.models`: the data a device reports (sensor readings or key-value pairs,
  encoded as a device encodes them) and its counter-based generators;
* :mod:`~sim.fleet.connection`: one MQTT connection (gmqtt) and its in-flight reports;
* :mod:`~sim.fleet.pool`: the fleet's connections, their ramp-up and their reconnection;
* :mod:`~sim.fleet.layouts`: the shard layouts the fleet follows from the announcement;
* :mod:`~sim.fleet.metrics`: the Prometheus metrics (no device id in any label);
* :mod:`~sim.fleet.truth`: the simulation-only ground truth and its file;
* :mod:`~sim.fleet.cli`: the command (options, signals, progress, summary).

Imports: :mod:`edge` (the device side it simulates), :mod:`sim.credentials` (device names
and passwords), :mod:`sim.models` (the data models) and, in the command only,
:mod:`broker.service.cli` (reading the announcement as the shuffler does); never :mod:`aggregator`
and no other part of :mod:`sim`. This file imports nothing, so that ``coco fleet --help``
loads only what :mod:`sim.fleet.cli` needs (numpy and gmqtt are imported when the command
runs).
"""
