"""Synthesized variants of the CDK app, each synthesized once per test session (synth takes seconds).

A variant is synthesized the way ``cdk synth`` does it (``App.synth``), so
cdk-nag's validation runs too: an unacknowledged finding fails the fixture.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

DOMAIN = "quota.example.com"
ZONE = "Z0123456789ABCDEFGHIJ"
CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/12345678-90ab-cdef-1234-567890abcdef"

# Every combination of alb/route53 x aurora on/off x 1, 4, 16 partitions, some with the other options.
VARIANTS: dict[str, dict[str, Any]] = {
    "alb-1": {"partitions": 1},
    "alb-1-aurora": {"partitions": 1, "aurora": True},
    "alb-4": {},  # the defaults
    "alb-16": {"partitions": "16"},  # as `-c partitions=16` gives it
    "alb-4-aurora": {"aurora": True},
    "alb-16-aurora-public-https": {
        "partitions": 16,
        "aurora": "true",
        "internet_facing": "true",
        "certificate_arn": CERTIFICATE,
        "domain": DOMAIN,
        "hosted_zone": ZONE,
    },
    "route53-4": {"front": "route53", "domain": DOMAIN, "hosted_zone": ZONE},
    "route53-1-aurora": {"front": "route53", "partitions": 1, "aurora": True, "domain": DOMAIN, "hosted_zone": ZONE},
    "route53-16": {"front": "route53", "partitions": 16, "domain": DOMAIN, "hosted_zone": ZONE},
    "route53-1": {"front": "route53", "partitions": 1, "domain": DOMAIN, "hosted_zone": ZONE},
    "route53-4-aurora": {"front": "route53", "aurora": True, "domain": DOMAIN, "hosted_zone": ZONE},
    "route53-16-aurora": {"front": "route53", "partitions": 16, "aurora": True, "domain": DOMAIN, "hosted_zone": ZONE},
}


@dataclass
class Synthesized:
    """One variant's cloud assembly: its folder, its template, the app (for the construct tree)."""

    name: str
    settings: Any  # infra.settings.DeploySettings
    outdir: Path
    template: dict[str, Any]
    app: Any  # aws_cdk.App

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: r for name, r in self.template["Resources"].items() if r["Type"] == kind}

    def props(self, kind: str) -> list[dict[str, Any]]:
        return [r.get("Properties", {}) for r in self.resources(kind).values()]

    def asset_dir(self, asset_hash: str) -> Path:
        return self.outdir / f"asset.{asset_hash}"

    def assets_manifest(self) -> dict[str, Any]:
        return json.loads((self.outdir / "Sluicegate.assets.json").read_text())


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("infra-build")


@pytest.fixture(scope="session")
def synthesize(tmp_path_factory: pytest.TempPathFactory, build_dir: Path) -> Iterator[Callable[[str], Synthesized]]:
    from infra.app import STACK_NAME, build_app
    from infra.settings import DeploySettings

    done: dict[str, Synthesized] = {}

    def synth(name: str) -> Synthesized:
        if name not in done:
            context = VARIANTS[name]
            outdir = tmp_path_factory.mktemp(f"cdk-{name}")
            app = build_app(context=context, outdir=str(outdir), build_dir=build_dir)
            assembly = app.synth()
            template = assembly.get_stack_by_name(STACK_NAME).template
            settings = DeploySettings.from_context(context.get)
            done[name] = Synthesized(name, settings, outdir, template, app)
        return done[name]

    yield synth


@pytest.fixture(params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest, synthesize: Callable[[str], Synthesized]) -> Synthesized:
    return synthesize(request.param)
