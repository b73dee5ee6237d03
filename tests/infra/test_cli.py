"""The real path: the pinned CDK CLI (package-lock.json) runs the app from cdk.json, offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from infra.assets import REPO

# What `make synth` exports: no EC2 metadata probe, no telemetry, no version check (see TOOLCHAIN.md).
OFFLINE = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "CDK_DISABLE_CLI_TELEMETRY": "true",
    "CDK_DISABLE_VERSION_CHECK": "1",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
}


def test_pinned_cli_synthesizes_the_app_from_cdk_json(tmp_path: Path) -> None:
    npx = shutil.which("npx")
    assert npx, "Node.js (npx) is needed for the CDK CLI: `make cdk-cli` installs it from package-lock.json"
    assert (REPO / "node_modules" / ".bin" / "cdk").exists(), "run `make cdk-cli` (npm ci) first"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CDK_"))}
    env.update(OFFLINE)
    command = [npx, "--no-install", "cdk", "synth", "--quiet", "--output", str(tmp_path), "-c", "partitions=2"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    template = json.loads((tmp_path / "Sluicegate.template.json").read_text())
    services = [r for r in template["Resources"].values() if r["Type"] == "AWS::ECS::Service"]
    assert len(services) == 2  # the -c value won over cdk.json's partitions=4
    (nag,) = json.loads((tmp_path / "validation-report.json").read_text())["pluginReports"]
    assert (nag["pluginName"], nag["conclusion"], nag["violations"]) == ("AwsSolutions", "success", [])


def test_cli_reports_a_bad_context_value(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CDK_"))}
    env.update(OFFLINE)
    command = ["npx", "--no-install", "cdk", "synth", "--quiet", "--output", str(tmp_path), "-c", "front=nlb"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert "context front='nlb': give one of alb, route53" in result.stderr
