"""deploy/prometheus/coco-alerts.yml with the real ``promtool``: the configuration that loads
it is valid, and each alert behaves as tests/deploy/alert_rules_test.yml expects
(``promtool test rules``: series in, alerts out at given times). A wrong expectation makes
promtool fail, so the unit tests are live.

promtool ships with Debian's ``prometheus`` package (scripts/test installs it); where it is
missing the test is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.debian_tools import debian_binary

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "coco-alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alert_rules_test.yml")
OPERATIONS = ROOT / "docs" / "operations.md"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = debian_binary("promtool", env="COCO_PROMTOOL")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_configuration_and_its_rules_are_valid() -> None:
    result = promtool("check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The unit tests with dimension 1 expected instead of 0: promtool reports the
    difference."""
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    shutil.copy(RULES, tmp_path / "deploy" / "prometheus" / RULES.name)
    (tmp_path / "tests" / "deploy").mkdir(parents=True)
    text = UNIT_TESTS.read_text(encoding="utf-8")
    assert text.count('dim: "0"') == 1
    wrong = tmp_path / "tests" / "deploy" / UNIT_TESTS.name
    wrong.write_text(text.replace('dim: "0"', 'dim: "1"'), encoding="utf-8")
    result = promtool("test", "rules", str(wrong), cwd=tmp_path)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_promtool_missing_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCO_PROMTOOL", "/nonexistent/promtool")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        promtool("--version")


def test_every_alert_has_a_runbook_line() -> None:
    """docs/operations.md's "Alerts" table has a row for each alert of the rules file, and
    no row for an alert that does not exist."""
    alerts = re.findall(r"(?m)^\s+- alert: (\w+)$", RULES.read_text(encoding="utf-8"))
    assert len(alerts) == len(set(alerts)) >= 13
    section = OPERATIONS.read_text(encoding="utf-8").split("### Alerts\n", 1)[1]
    section = section.split("\n#", 1)[0]
    rows = re.findall(r"(?m)^\| `(Coco\w+)` \((?:critical|warning)\) \| .+ \| .+ \|$", section)
    assert rows == alerts
