"""``coco credentials``: the MQTT accounts of a deployment, every password derived from one
secret.

* :mod:`~sim.credentials.accounts`: device names, the passwords of devices and service
  accounts (HMAC-SHA256 of the name under the deployment secret) and the secret's file;
* :mod:`~sim.credentials.mosquitto`: what the broker reads, a Mosquitto password file or the
  dynamic-security plugin's configuration (accounts and roles);
* :mod:`~sim.credentials.cli`: the command, which writes them and the services' password
  files.

Imports: :mod:`edge` (topic names, and the batch key in the command) and the standard
library; nothing else of :mod:`sim` (:mod:`sim.fleet` imports it for its devices' names and
passwords).
"""
