"""cdk-nag and cfn-lint on every synthesized variant."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from aws_cdk import App, Stack, Validations
from aws_cdk import aws_sns as sns

from infra.nag import MIN_REASON_WORDS, acknowledge, add_checks
from tests.infra.conftest import VARIANTS, Synthesized

NAG_PREFIX = "AwsSolutions::"


def test_nag_stops_a_synth_with_an_unacknowledged_finding(tmp_path: Path) -> None:
    # The variants synthesize because every finding is fixed or acknowledged; this shows the check is live.
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "Bad")
    sns.Topic(stack, "Topic")  # no SSL-only policy, no encryption: AwsSolutions-SNS2 and SNS3
    add_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = (tmp_path / "validation-report.json").read_text()
    assert "AwsSolutions-SNS3" in report and "Bad/Topic/Resource" in report


def test_acknowledging_needs_a_reason() -> None:
    app = App()
    topic = sns.Topic(Stack(app, "S"), "Topic")
    with pytest.raises(ValueError, match="real reason"):
        acknowledge(topic, "AwsSolutions-SNS3", "fine")


def test_every_variant_passes_nag_and_each_acknowledgement_is_needed_and_explained(variant: Synthesized) -> None:
    # Synthesizing ran AwsSolutions (the fixture would have raised on a finding); its report lists what was
    # accepted, where, and why.
    (report,) = json.loads((variant.outdir / "validation-report.json").read_text())["pluginReports"]
    assert report["pluginName"] == "AwsSolutions"
    assert (report["conclusion"], report["violations"]) == ("success", [])
    suppressed = {(item["acknowledgedAt"], item["acknowledgedId"]) for item in report["suppressedViolations"]}
    for item in report["suppressedViolations"]:
        assert len(item["reason"].split()) >= MIN_REASON_WORDS, f"{item['ruleName']}: {item['reason']!r}"
    # Every acknowledgement in the construct tree matched a real finding: none is stale.
    made = {
        (construct.node.path, rule)
        for construct in variant.app.node.find_all()
        for entry in construct.node.metadata
        if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for rule in entry.data
        if rule.startswith(NAG_PREFIX)
    }
    assert made and made <= suppressed, f"acknowledged but never found: {sorted(made - suppressed)}"


def test_cfn_lint_passes_on_every_template(synthesize: Callable[[str], Synthesized]) -> None:
    templates = [str(synthesize(name).outdir / "Sluicegate.template.json") for name in sorted(VARIANTS)]
    # W3005 (a DependsOn that a reference already implies) is how the CDK writes templates.
    command = [str(Path(sys.executable).with_name("cfn-lint")), "--ignore-checks", "W3005", "--", *templates]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
