"""Fleet credentials: the Mosquitto password-file and dynamic-security generators against
the real ``mosquitto_passwd``, ``mosquitto_ctrl`` and a real broker, the derived passwords,
and ``coco credentials``. (The dynamic-security roles on a live broker:
tests/deploy/test_acl.py.)"""

from __future__ import annotations

import base64
import json
import shutil
import stat
import subprocess
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from edge import CocoError
from edge.batch_auth import load_or_create_signing_key, public_key_hex
from sim.cli import app
from sim.credentials.accounts import (
    create_secret,
    device_id,
    device_password,
    read_secret,
    service_password,
)
from sim.credentials.mosquitto import (
    dynsec_config,
    dynsec_password,
    mosquitto_password_file,
    mosquitto_password_line,
    verify_mosquitto_password_line,
)
from tests.conftest import MOSQUITTO, Broker, free_port

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
needs_passwd = pytest.mark.skipif(
    not Path(MOSQUITTO_PASSWD).exists(), reason="mosquitto_passwd is not installed"
)
MOSQUITTO_CTRL = shutil.which("mosquitto_ctrl") or "/usr/bin/mosquitto_ctrl"
needs_ctrl = pytest.mark.skipif(
    not Path(MOSQUITTO_CTRL).exists(), reason="mosquitto_ctrl is not installed"
)


def mosquitto_passwd_line(tmp_path: Path, user: str, password: str) -> str:
    path = tmp_path / "ref-passwd"
    subprocess.run([MOSQUITTO_PASSWD, "-c", "-b", str(path), user, password], check=True)
    return path.read_text().strip()


@needs_passwd
@pytest.mark.parametrize("password", ["secret", "", "pässwörd with spaces", "x" * 200])
def test_line_is_byte_identical_to_mosquitto_passwd_given_its_salt(
    tmp_path: Path, password: str
) -> None:
    reference = mosquitto_passwd_line(tmp_path, "alice", password)
    _, hashed = reference.split(":", 1)
    _, hash_id, iterations, salt, _ = hashed.split("$")
    assert hash_id == "7"
    ours = mosquitto_password_line(
        "alice", password, salt=base64.b64decode(salt), iterations=int(iterations)
    )
    assert ours == reference
    assert verify_mosquitto_password_line(reference, password)
    assert not verify_mosquitto_password_line(reference, password + "x")


def test_line_format_and_fresh_salts() -> None:
    a = mosquitto_password_line("dev-000001", "pw")
    b = mosquitto_password_line("dev-000001", "pw")
    assert a != b  # 12 random salt bytes each
    user, hashed = a.split(":", 1)
    _, hash_id, iterations, salt, digest = hashed.split("$")
    assert (user, hash_id, iterations) == ("dev-000001", "7", "101")
    assert len(base64.b64decode(salt)) == 12
    assert len(base64.b64decode(digest)) == 64
    assert verify_mosquitto_password_line(a, "pw")
    assert verify_mosquitto_password_line(b, "pw")


@pytest.mark.parametrize("username", ["", "a:b", "a\nb"])
def test_invalid_usernames_are_refused(username: str) -> None:
    with pytest.raises(ValueError, match="username"):
        mosquitto_password_line(username, "pw")


def test_duplicate_usernames_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        mosquitto_password_file([("a", "1"), ("a", "2")])


@needs_passwd
def test_mosquitto_passwd_maintains_a_generated_file(tmp_path: Path) -> None:
    """mosquitto_passwd adds and deletes users in our file and keeps our lines intact."""
    path = tmp_path / "passwd"
    path.write_text(mosquitto_password_file([("alice", "a-pw"), ("bob", "b-pw")]))
    subprocess.run([MOSQUITTO_PASSWD, "-b", str(path), "carol", "c-pw"], check=True)
    subprocess.run([MOSQUITTO_PASSWD, "-D", str(path), "bob"], check=True)
    lines = {line.split(":", 1)[0]: line for line in path.read_text().splitlines()}
    assert sorted(lines) == ["alice", "carol"]
    assert verify_mosquitto_password_line(lines["alice"], "a-pw")
    assert verify_mosquitto_password_line(lines["carol"], "c-pw")


def connack(broker: Broker, username: str, password: str) -> int:
    """The CONNACK reason code of an MQTT 5 connection (paho's own loop, no threads)."""
    codes: list[int] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    client.on_connect = lambda _c, _u, _f, rc, _p: codes.append(rc.value)
    client.connect("127.0.0.1", broker.port)
    for _ in range(200):  # each loop() waits up to 0.1 s for traffic
        client.loop(timeout=0.1)
        if codes:
            break
    client.disconnect()
    assert codes, "no CONNACK"
    return codes[0]


def test_generated_password_file_is_accepted_by_mosquitto(tmp_path: Path) -> None:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    secret = b"s3cret"
    devices = [device_id(i) for i in range(3)]
    passwd = tmp_path / "passwd"
    accounts = [(d, device_password(secret, d)) for d in devices]
    accounts.append(("shuffler", service_password(secret, "shuffler")))
    passwd.write_text(mosquitto_password_file(accounts))
    # Later lines win in Mosquitto's config: this turns the fixture's anonymous access off.
    broker = Broker(
        tmp_path, free_port(), extra_config=f"allow_anonymous false\npassword_file {passwd}\n"
    )
    broker.start()
    try:
        for d in devices:
            assert connack(broker, d, device_password(secret, d)) == 0
        assert connack(broker, "shuffler", service_password(secret, "shuffler")) == 0
        assert connack(broker, devices[0], device_password(secret, devices[1])) == 0x87
        assert connack(broker, devices[0], device_password(b"other", devices[0])) == 0x87
    finally:
        broker.stop()


def test_derived_passwords_are_separated() -> None:
    secret = b"s3cret"
    assert device_password(secret, "dev-000001") == device_password(secret, "dev-000001")
    assert device_password(secret, "dev-000001") != device_password(secret, "dev-000002")
    assert device_password(b"other", "dev-000001") != device_password(secret, "dev-000001")
    # A device called like a service never gets the service's password (domain tag).
    assert service_password(secret, "shuffler") != device_password(secret, "shuffler")
    with pytest.raises(ValueError, match="empty"):
        service_password(b"", "shuffler")


def test_secret_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "secret"
    secret = create_secret(path)
    assert len(secret) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret(path) == secret
    with pytest.raises(FileExistsError):
        create_secret(path)
    path.write_bytes(b"  \n")
    with pytest.raises(ValueError, match="empty"):
        read_secret(path)


def test_coco_credentials_writes_passwd_and_service_passwords(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    passwd = tmp_path / "auth" / "passwd"
    services = tmp_path / "services"
    args = [
        "credentials",
        "--secret-file",
        str(secret_file),
        "--create-secret",
        "--devices",
        "4",
        "--device",
        "greenhouse-7",
        "--service",
        "shuffler",
        "--service",
        "aggregator",
        "--passwd-out",
        str(passwd),
        "--service-password-dir",
        str(services),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    secret = read_secret(secret_file)
    lines = {line.split(":", 1)[0]: line for line in passwd.read_text().splitlines()}
    names = [device_id(i) for i in range(4)] + ["greenhouse-7"]
    assert sorted(lines) == sorted([*names, "shuffler", "aggregator"])
    for name in names:
        assert verify_mosquitto_password_line(lines[name], device_password(secret, name))
    for name in ("shuffler", "aggregator"):
        assert verify_mosquitto_password_line(lines[name], service_password(secret, name))
        password_file = services / name / "password"
        assert password_file.read_text() == service_password(secret, name)
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(passwd.stat().st_mode) == 0o600
    assert secret.decode() not in result.output

    # A second run keeps the secret: the same passwords.
    assert CliRunner().invoke(app, args).exit_code == 0
    assert read_secret(secret_file) == secret

    shown = CliRunner().invoke(
        app, ["credentials", "--secret-file", str(secret_file), "--show-password", "dev-000002"]
    )
    assert shown.exit_code == 0
    assert shown.output.strip() == device_password(secret, "dev-000002")


def test_coco_credentials_writes_the_batch_key_once(tmp_path: Path) -> None:
    """The shuffler's private key (0600, never overwritten) and its public half apart."""
    secret_file, keys = tmp_path / "secret", tmp_path / "batch-key"
    args = ["credentials", "--secret-file", str(secret_file), "--create-secret"]
    args += ["--passwd-out", str(tmp_path / "passwd"), "--batch-key-dir", str(keys)]
    assert CliRunner().invoke(app, args).exit_code == 0
    private, public = keys / "private" / "signing.key", keys / "public" / "signing.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_or_create_signing_key(private)
    assert public.read_text().strip() == public_key_hex(key)
    first = private.read_bytes()
    assert CliRunner().invoke(app, args).exit_code == 0
    assert private.read_bytes() == first
    assert private.read_text() not in public.read_text()
    # the batch key alone needs no secret (the README's pipeline by hand)
    alone = CliRunner().invoke(app, ["credentials", "--batch-key-dir", str(keys)])
    assert alone.exit_code == 0, alone.output
    assert private.read_bytes() == first
    none = CliRunner().invoke(app, ["credentials", "--passwd-out", str(tmp_path / "p")])
    assert none.exit_code == 1
    assert "--secret-file is required" in none.output


def test_coco_credentials_errors_are_clear(tmp_path: Path) -> None:
    missing = CliRunner().invoke(
        app, ["credentials", "--secret-file", str(tmp_path / "none"), "--passwd-out", "x"]
    )
    assert missing.exit_code == 1
    assert "error:" in missing.output
    secret = tmp_path / "secret"
    secret.write_text("abc")
    clash = CliRunner().invoke(
        app,
        [
            "credentials",
            "--secret-file",
            str(secret),
            "--device",
            "shuffler",
            "--service",
            "shuffler",
            "--passwd-out",
            str(tmp_path / "passwd"),
        ],
    )
    assert clash.exit_code == 1
    assert "duplicate" in clash.output
    assert not (tmp_path / "passwd").exists()


# -- the dynamic-security plugin's configuration ------------------------------------------


@needs_ctrl
@pytest.mark.parametrize("password", ["secret", "pässwörd with spaces", "x" * 200])
def test_dynsec_password_is_identical_to_mosquitto_ctrl_given_its_salt(
    tmp_path: Path, password: str
) -> None:
    """``mosquitto_ctrl dynsec init`` writes a client as the plugin stores it."""
    path = tmp_path / "dynsec.json"
    subprocess.run(
        [MOSQUITTO_CTRL, "dynsec", "init", str(path), "admin", password],
        check=True,
        capture_output=True,
    )
    (reference,) = json.loads(path.read_text())["clients"]
    ours = dynsec_password(
        password, salt=base64.b64decode(reference["salt"]), iterations=reference["iterations"]
    )
    assert ours == {k: reference[k] for k in ("password", "salt", "iterations")}
    assert dynsec_password(password) != dynsec_password(password)  # fresh salts
    assert len(base64.b64decode(dynsec_password(password)["salt"])) == 12


def test_dynsec_config_refuses_ambiguous_accounts() -> None:
    ok = dynsec_config("fleet", [("dev-1", "a")], [("shuffler", "b")])
    assert [c["username"] for c in ok["clients"]] == ["shuffler", "dev-1"]
    with pytest.raises(ValueError, match="duplicate"):
        dynsec_config("fleet", [("dev-1", "a"), ("dev-1", "b")], [])
    with pytest.raises(ValueError, match="service's client id"):
        dynsec_config("fleet", [("shuffler", "a")], [("shuffler", "b")])
    with pytest.raises(ValueError, match="service's client id"):
        dynsec_config("fleet", [("shuffler-out", "a")], [("shuffler", "b")])
    bound = {c["username"]: c.get("clientid") for c in ok["clients"]}
    assert bound == {"shuffler": None, "dev-1": "dev-1"}
    services = [("shuffler", "b"), ("aggregator", "c"), ("announcer", "d")]
    full = dynsec_config("fleet", [], services)
    assert {c["username"]: c.get("clientid") for c in full["clients"]} == {
        "shuffler": None,
        "aggregator": None,
        "announcer": "announcer",
    }
    with pytest.raises(ValueError, match="no role for service account 'gateway'"):
        dynsec_config("fleet", [], [("gateway", "a")])
    for pattern in ("%u", "%c"):  # Mosquitto 2.1 would substitute it in the device's ACL
        with pytest.raises(ValueError, match="substitution"):
            dynsec_config("fleet", [(pattern, "a")], [])
    with pytest.raises(CocoError, match="device name"):
        dynsec_config("fleet", [("a/b", "a")], [])
    with pytest.raises(CocoError, match="deployment name"):
        dynsec_config("fl/eet", [], [])


def test_coco_credentials_writes_the_dynsec_configuration(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret")
    dynsec = tmp_path / "broker" / "dynamic-security.json"
    passwd = tmp_path / "broker" / "passwd"
    args = ["credentials", "--secret-file", str(secret_file), "--devices", "2"]
    args += ["--device", "greenhouse-7", "--service", "shuffler", "--service", "announcer"]
    result = CliRunner().invoke(
        app,
        [*args, "--deployment", "site", "--dynsec-out", str(dynsec), "--passwd-out", str(passwd)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["dynsec"], summary["deployment"]) == (str(dynsec), "site")
    assert stat.S_IMODE(dynsec.stat().st_mode) == 0o600
    config = json.loads(dynsec.read_text())
    clients = {c["username"]: c for c in config["clients"]}
    names = [device_id(0), device_id(1), "greenhouse-7"]
    assert sorted(clients) == sorted([*names, "shuffler", "announcer"])
    for name in names:
        salt = base64.b64decode(clients[name]["salt"])
        expected = dynsec_password(device_password(b"s3cret", name), salt=salt)
        assert clients[name]["password"] == expected["password"]
    salt = base64.b64decode(clients["shuffler"]["salt"])
    expected = dynsec_password(service_password(b"s3cret", "shuffler"), salt=salt)
    assert clients["shuffler"]["password"] == expected["password"]
    topics = {acl["topic"] for role in config["roles"] for acl in role["acls"]}
    assert "coco/v1/site/ingress/greenhouse-7" in topics
    assert all(t.startswith("coco/v1/site/") for t in topics)
    # The password file of the same accounts, for a broker without the plugin.
    lines = {line.split(":", 1)[0]: line for line in passwd.read_text().splitlines()}
    assert sorted(lines) == sorted(clients)
    assert verify_mosquitto_password_line(
        lines["greenhouse-7"], device_password(b"s3cret", "greenhouse-7")
    )

    no_deployment = CliRunner().invoke(app, [*args, "--dynsec-out", str(tmp_path / "d.json")])
    assert no_deployment.exit_code == 1
    assert "--dynsec-out needs --deployment" in no_deployment.output
    no_output = CliRunner().invoke(app, args)
    assert no_output.exit_code == 1
    assert "--dynsec-out" in no_output.output
    unknown = CliRunner().invoke(
        app,
        [
            *args,
            "--service",
            "gateway",
            "--deployment",
            "site",
            "--dynsec-out",
            str(tmp_path / "d.json"),
            "--passwd-out",
            str(tmp_path / "p"),
        ],
    )
    assert unknown.exit_code == 1
    assert "no role for service account 'gateway'" in unknown.output
    assert not (tmp_path / "d.json").exists()
    assert not (tmp_path / "p").exists()
