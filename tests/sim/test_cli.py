"""The ``coco`` command line: `privacy` and `simulate`, through typer and as installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aggregator.accountant import (
    amplify_spec,
    blanket_epsilon,
    blanket_pair_for_spec,
    epsilon_central,
    epsilon_total_rounds,
    generic_clone_probability,
)
from edge import MechanismSpec
from edge.cli_options import apply_deprecated_env
from sim.cli import app
from sim.models.sensors import SensorFleet

runner = CliRunner()


def run_json(*args: str) -> object:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_privacy_json_has_the_documented_keys_and_the_certified_value() -> None:
    out = run_json(
        "privacy",
        "--mechanism",
        "coco",
        "--epsilon",
        "1",
        "--s",
        "8",
        "--d",
        "128",
        "--n",
        "10000",
        "--delta",
        "1e-6",
    )
    assert isinstance(out, dict)
    for key in (
        "mechanism",
        "epsilon_local",
        "t",
        "n",
        "delta",
        "epsilon_central",
        "epsilon_central_generic",
        "clone_probability",
        "efmrtt19",
        "fmt21",
    ):
        assert key in out
    spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
    assert out["t"] == spec.t
    assert out["certified"] is True
    assert "epsilon_central_mechanism" not in out  # the paper's invalid pair is not reported
    assert out["bound"] == "blanket"
    assert out["epsilon_central"] == amplify_spec(spec, n=10_000, delta=1e-6).epsilon_central
    assert out["epsilon_central"] == blanket_epsilon(
        blanket_pair_for_spec(spec, n=10_000), delta=1e-6
    )
    assert out["epsilon_central_generic"] == epsilon_central(
        n=10_000,
        delta=1e-6,
        epsilon0=spec.epsilon_effective,
        clone_probability=generic_clone_probability(spec.epsilon_effective),
    )
    assert out["epsilon_central"] < out["epsilon_central_generic"] < 1.0


def test_privacy_curve_is_a_list_falling_with_n() -> None:
    out = run_json(
        "privacy",
        "--mechanism",
        "generic",
        "--epsilon",
        "0.5",
        "--n",
        "1000",
        "--n",
        "10000",
        "--n",
        "100000",
        "--delta",
        "1e-6",
    )
    assert isinstance(out, list)
    assert [row["n"] for row in out] == [1000, 10000, 100000]
    eps = [row["epsilon_central"] for row in out]
    assert eps == sorted(eps, reverse=True)
    # The value for (0.5, 10000, 1e-6) of the reference tables (docs/reference/amplification.tsv).
    assert eps[1] == pytest.approx(0.01811740826, abs=2e-6)


def test_collision_s1_t2_is_binary_randomised_response() -> None:
    rr = run_json(
        "privacy",
        "--mechanism",
        "collision",
        "--epsilon",
        "1",
        "--s",
        "1",
        "--t",
        "2",
        "--n",
        "5000",
        "--delta",
        "1e-6",
    )
    assert isinstance(rr, dict)
    # design note, section 5: for binary randomised response the blanket bound is the generic
    # one (both searches stop within their tolerances: 1e-5 relative and 1e-9 absolute)
    assert rr["epsilon_central"] == pytest.approx(rr["epsilon_central_generic"], rel=2e-5)
    assert rr["epsilon_central"] >= rr["epsilon_central_generic"] * (1 - 1e-6)


def test_privacy_rounds_json_contract_and_monotone() -> None:
    base = "privacy --mechanism collision --epsilon 1 --s 4 --d 64 --n 2000 --n 20000 --delta 1e-6"
    totals = []
    for rounds in (1, 10, 100):
        out = run_json(*base.split(), "--rounds", str(rounds))
        assert isinstance(out, list)
        for row in out:
            for key in ("epsilon_central", "epsilon_central_generic", "delta", "n", "rounds"):
                assert key in row
            assert row["rounds"] == rounds
            # one batch: the PLD is pessimistic; eps_c is searched to 1e-5 relative
            assert row["epsilon_central"] <= row["epsilon_total"] * (1 + 2e-5)
        assert out[0]["epsilon_total"] > out[1]["epsilon_total"]  # falls with n
        totals.append(out[0]["epsilon_total"])
    assert totals == sorted(totals)  # grows with the rounds
    spec = MechanismSpec(mechanism="collision", d=64, s=4, epsilon=1.0)
    # as the aggregator's ledger accounts 10 rounds of 2,000 (composed at 1,984)
    assert totals[1] == epsilon_total_rounds(spec, {2000: 10}, delta=1e-6)
    plain = run_json(*base.split())
    assert isinstance(plain, list)
    assert "epsilon_total" not in plain[0]
    assert "rounds" not in plain[0]
    text = runner.invoke(app, [*base.split(), "--rounds", "10"])
    assert text.exit_code == 0
    assert "epsilon_total (10 rounds)" in text.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--mechanism",
                "generic",
                "--epsilon",
                "1",
                "--n",
                "10",
                "--delta",
                "1e-6",
                "--rounds",
                "3",
            ],
            "--rounds needs --mechanism coco or collision",
        ),
        (
            [
                "--mechanism",
                "coco",
                "--epsilon",
                "1",
                "--s",
                "1",
                "--t",
                "4",
                "--n",
                "10",
                "--delta",
                "1e-6",
                "--rounds",
                "0",
            ],
            "--rounds must be >= 1",
        ),
        (
            ["--mechanism", "coco", "--epsilon", "1", "--n", "10", "--delta", "1e-6"],
            "--s is required",
        ),
        (
            ["--mechanism", "coco", "--epsilon", "1", "--s", "4", "--n", "10", "--delta", "1e-6"],
            "give --t, or --d",
        ),
        (
            [
                "--mechanism",
                "coco",
                "--epsilon",
                "-1",
                "--s",
                "4",
                "--t",
                "10",
                "--n",
                "10",
                "--delta",
                "1e-6",
            ],
            "epsilon must be in",
        ),
    ],
)
def test_privacy_errors_are_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["privacy", *args])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


SIMULATE = "simulate --mechanism collision --d 32 --s 4 --epsilon 1 --n 2000 --seed 3 --trials 40"


def test_simulate_json_matches_theory() -> None:
    out = run_json(*SIMULATE.split())
    assert isinstance(out, dict)
    keys = "t n mse_mean mse_mean_theory mse_freq mse_freq_theory max_abs_error_mean"
    assert set(keys.split()) <= set(out)
    spec = MechanismSpec(mechanism="collision", d=32, s=4, epsilon=1.0)
    assert out["t"] == spec.t
    assert out["mse_mean_theory"] == pytest.approx(spec.moments.mean_mse(32, 4) / 2000)
    # 40 trials of a sum over 32 dims: relative SE about sqrt(2/32/40) = 4%; allow 4 SE.
    assert out["mse_mean"] / out["mse_mean_theory"] == pytest.approx(1, abs=0.16)
    assert out["mse_freq"] / out["mse_freq_theory"] == pytest.approx(1, abs=0.16)
    again = run_json(*SIMULATE.split())
    assert isinstance(again, dict)
    assert again["mse_mean"] == out["mse_mean"]  # the seed makes the run reproducible


def test_simulate_rejects_bad_parameters() -> None:
    result = runner.invoke(
        app,
        [
            "simulate",
            "--mechanism",
            "coco",
            "--d",
            "4",
            "--s",
            "8",
            "--epsilon",
            "1",
            "--n",
            "10",
            "--seed",
            "1",
        ],
    )
    assert result.exit_code == 1
    assert "s must be in [1, d=4], got 8" in result.output


SENSORS = "simulate --model sensors --mechanism coco --d 6 --s 2 --epsilon 4 --n 500 --seed 2"


def test_simulate_sensors_json_gives_each_trial_and_channel() -> None:
    out = run_json(*SENSORS.split(), "--trials", "3")
    assert isinstance(out, dict)
    assert (out["model"], out["d"], out["s"], out["n"], out["trials"]) == ("sensors", 6, 2, 500, 3)
    assert len(out["per_trial"]) == 3
    names = [ch["name"] for ch in out["per_trial"][0]["channels"]]
    assert names == list(out["coverage"]) == list(SensorFleet(n_devices=1).names)
    for trial in out["per_trial"]:
        for ch in trial["channels"]:
            assert {"estimate", "ci95_halfwidth", "truth"} <= set(ch)
            assert ch["ci95_halfwidth"] > 0
    # The truth is the fleet's exact mean of round k's readings (simulation only; k < 24).
    fleet = SensorFleet(n_devices=500, channels=6, seed=2)
    for k, trial in enumerate(out["per_trial"]):
        truth = [ch["truth"] for ch in trial["channels"]]
        assert truth == pytest.approx(fleet.ground_truth_mean(k).tolist())
    again = run_json(*SENSORS.split(), "--trials", "3")
    assert isinstance(again, dict)
    assert again["per_trial"] == out["per_trial"]  # the seed makes the run reproducible
    table = runner.invoke(app, SENSORS.split())
    assert table.exit_code == 0, table.output
    assert "coverage" in table.output
    assert "temperature" in table.output
    # the column holds the half-width only, and says so
    header = next(line for line in table.output.splitlines() if "coverage" in line)
    assert header.split()[-4:] == ["95%", "half-width", "RMS", "error"]
    assert "mean +-" not in table.output


@pytest.mark.parametrize("d", [3, 12, 20])
def test_simulate_sensors_takes_any_channel_count(d: int) -> None:
    out = run_json(*SENSORS.replace("--d 6", f"--d {d}").split(), "--trials", "2")
    assert isinstance(out, dict)
    names = list(out["coverage"])
    assert names == list(SensorFleet(n_devices=1, channels=d).names)
    assert len(names) == d
    for trial in out["per_trial"]:
        assert all(ch["ci95_halfwidth"] > 0 for ch in trial["channels"])
    table = runner.invoke(app, SENSORS.replace("--d 6", f"--d {d}").split())
    assert table.exit_code == 0, table.output
    assert "channels must be" not in table.output
    assert names[-1] in table.output


def test_simulate_sensors_refuses_no_channels() -> None:
    result = runner.invoke(app, [*SENSORS.replace("--d 6", "--d 0").split()])
    assert result.exit_code == 1
    assert "error: d must be in [1," in result.output


def test_installed_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("coco")
    if not exe.exists():
        found = shutil.which("coco")
        assert found, "the coco console script is not installed (pip install -e .)"
        exe = Path(found)
    proc = subprocess.run(
        [
            str(exe),
            "privacy",
            "--mechanism",
            "generic",
            "--epsilon",
            "1",
            "--n",
            "1000",
            "--delta",
            "1e-6",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(proc.stdout)["mechanism"] == "generic"


def test_old_credential_variables_still_work_with_a_warning() -> None:
    """``COCO_USERNAME`` and friends (``coco device``'s old names) feed the shared
    ``COCO_MQTT_*`` options, with one deprecation warning each; the new name wins."""
    environ = {"COCO_USERNAME": "dev-1", "COCO_PASSWORD": "old", "COCO_MQTT_PASSWORD": "new"}
    warnings = apply_deprecated_env(environ)
    assert environ["COCO_MQTT_USERNAME"] == "dev-1"
    assert environ["COCO_MQTT_PASSWORD"] == "new"
    assert warnings == [
        "warning: COCO_USERNAME is deprecated, use COCO_MQTT_USERNAME",
        "warning: COCO_PASSWORD is deprecated, use COCO_MQTT_PASSWORD",
    ]
    assert apply_deprecated_env({"COCO_MQTT_USERNAME": "x"}) == []


def test_help_texts_read_whole_at_80_columns() -> None:
    """No help text loses words to the markup or the width (issue: 'Simulated devices .',
    a docstring pointing at a module)."""
    for command in (["device"], ["demo"], ["fleet"], ["shuffler"], ["aggregator", "run"]):
        result = CliRunner().invoke(app, [*command, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        assert "module doc" not in result.output
        # a word, a space, a full stop: a word lost (a "." alone on a line is the end of a
        # word too wide for its column, folded there: sim/cli_help.py)
        assert not re.search(r"\w \.", result.output.replace("...", "")), command


HEAVY = ("numpy", "scipy", "matplotlib", "aiomqtt", "gmqtt", "paho", "cryptography")


def imported_by_help(*command: str) -> set[str]:
    """Top-level packages imported by ``coco COMMAND --help``, in a fresh interpreter."""
    code = (
        "import sys\n"
        f"sys.argv = ['coco', *{list(command)!r}, '--help']\n"
        "from sim.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return set(out.splitlines()[-1].split())


def test_coco_help_imports_no_heavy_module() -> None:
    assert imported_by_help() & set(HEAVY) == set()


@pytest.mark.parametrize(
    "command",
    [("privacy",), ("aggregator", "run"), ("experiment", "all"), ("demo",), ("simulate",)],
)
def test_command_help_imports_neither_scipy_nor_matplotlib(command: tuple[str, ...]) -> None:
    assert imported_by_help(*command) & {"scipy", "matplotlib"} == set()


@pytest.mark.parametrize(
    "command",
    [
        ("privacy",),
        ("aggregator", "run"),
        ("shuffler",),
        ("announce",),
        ("device",),
        ("fleet",),
        ("simulate",),
        ("demo",),
        ("experiment", "all"),
    ],
)
def test_service_and_device_help_imports_no_heavy_module(command: tuple[str, ...]) -> None:
    """numpy, the MQTT clients and the crypto library are imported when a command runs,
    not for its --help (bench/README.md: CPU seconds at start-up)."""
    assert imported_by_help(*command) & set(HEAVY) == set()


def test_listed_help_is_each_lazy_command_own() -> None:
    from sim.cli import LAZY_COMMANDS, load_command  # noqa: PLC0415
    from sim.demo import config as demo_config  # noqa: PLC0415
    from sim.demo.cli import DEMO_DEVICES  # noqa: PLC0415

    for name, (_, _, listed) in LAZY_COMMANDS.items():
        command = load_command(name)
        assert command.get_short_help_str(limit=1000) == listed, name
    assert DEMO_DEVICES == demo_config.DEFAULT_DEVICES
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in LAZY_COMMANDS:
        assert name in result.output


def _coco(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``coco ARGS`` in a fresh interpreter (the environment without COCO_LOG_LEVEL, plus
    ``env``)."""
    base = {k: v for k, v in os.environ.items() if k != "COCO_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", "from sim.cli import main; main()", *args],
        cwd=Path(__file__).resolve().parents[2],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


SMALL_RUN = [
    "simulate",
    "--mechanism",
    "coco",
    "--d",
    "6",
    "--s",
    "2",
    "--epsilon",
    "1",
    "--n",
    "10",
    "--seed",
    "1",
]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_unknown_log_level_is_a_one_line_error_naming_the_levels(how: str) -> None:
    """Issue 18: `COCO_LOG_LEVEL=verbose` or `--log-level verbose` printed a 41-line
    traceback."""
    if how == "option":
        done = _coco("--log-level", "verbose", *SMALL_RUN)
    else:
        done = _coco(*SMALL_RUN, env={"COCO_LOG_LEVEL": "verbose"})
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "'verbose'" in lines[0]
    assert "debug, info, warning, error, critical" in lines[0]
    assert "--log-level" in lines[0]
    assert "COCO_LOG_LEVEL" in lines[0]


def test_a_known_log_level_in_any_case_is_taken() -> None:
    assert _coco("--log-level", "DEBUG", *SMALL_RUN).returncode == 0
    assert _coco(*SMALL_RUN, env={"COCO_LOG_LEVEL": "Warning"}).returncode == 0


def _options_without_help() -> list[str]:
    """``command --option`` of every visible option of every command with no help text."""
    missing: list[str] = []

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "list_commands"):
            ctx = typer.Context(command)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name])
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden and not param.help:
                missing.append(" ".join([*path, param.opts[0]]))

    walk(typer.main.get_command(app), ["coco"])
    return missing


def test_every_option_of_every_command_has_a_help_text() -> None:
    """Issue 18: --cert-file, --key-file and fleet --password showed no help text."""
    assert _options_without_help() == []
    result = runner.invoke(app, ["device", "--help"], terminal_width=200)
    for option in ("--cert-file", "--key-file"):
        line = next(x for x in result.output.splitlines() if option + " " in x)
        assert "<path>" in line
        assert line.split("<path>", 1)[1].strip(" │")  # a help text beside the option


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version  # noqa: PLC0415

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"coco {version('coco-fleet')}\n"


def test_no_subcommand_offers_shell_completion() -> None:
    """``coco`` has no completion (add_completion=False): neither has any subcommand's help."""
    from sim.cli import LAZY_COMMANDS  # noqa: PLC0415

    names = [*LAZY_COMMANDS, "simulate", "demo", "aggregator run", "privacy calibrate"]
    for name in names:
        result = CliRunner().invoke(app, [*name.split(), "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "completion" not in result.output, name


def test_the_aggregator_prints_its_url_only_once_it_serves(tmp_path: Path) -> None:
    """A busy port: the one error line, not the URL of a server that never listened."""
    from tests.ports import busy_port, free_port  # noqa: PLC0415

    spec_file = tmp_path / "spec.json"
    spec = MechanismSpec(mechanism="coco", d=8, s=2, epsilon=1.0)
    spec_file.write_text(json.dumps(spec.to_dict()))
    with busy_port() as port:
        result = CliRunner().invoke(
            app,
            [
                *("aggregator", "run", "--deployment", "busy", "--spec", str(spec_file)),
                *("--delta", "1e-6", "--min-batch", "2", "--metrics-port", str(port)),
                *("--batch-public-key", "ab" * 32),
                *("--broker", f"mqtt://127.0.0.1:{free_port()}"),  # never reached
            ],
        )
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: port {port} on 127.0.0.1 is in use")
    assert "http://" not in result.stderr
