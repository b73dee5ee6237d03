"""The CDK app: ``npx cdk synth|deploy`` runs ``python -m infra.app`` (see ``cdk.json``).

Context keys (``-c key=value`` or ``cdk.json``): partitions, front, aurora,
domain, hosted_zone, certificate_arn, internet_facing (see
:class:`infra.settings.DeploySettings`). cdk-nag's AwsSolutions checks run at
every synth; an unacknowledged finding stops it.

Example:
    >>> app = build_app(context={"partitions": 1}, outdir="/tmp/cdk.out")  # doctest: +SKIP
    >>> app.synth().get_stack_by_name(STACK_NAME).template["Resources"]  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import App

from infra.assets import REPO, AssetError, stage_assets
from infra.nag import add_checks
from infra.settings import DeploySettings, SettingsError
from infra.stack import SluicegateStack

STACK_NAME = "Sluicegate"
BUILD_DIR = REPO / "build" / "infra-assets"


def build_app(
    *, context: Mapping[str, object] | None = None, outdir: str | None = None, build_dir: Path = BUILD_DIR
) -> App:
    """The app with the stack for the context's settings, its assets staged and cdk-nag registered."""
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    settings = DeploySettings.from_context(app.node.try_get_context)
    assets = stage_assets(build_dir=build_dir)
    SluicegateStack(app, STACK_NAME, settings=settings, assets=assets, build_dir=build_dir)
    add_checks(app)
    return app


def main() -> None:
    try:
        app = build_app()
    except (SettingsError, AssetError) as exc:
        sys.exit(f"infra: {exc}")
    app.synth()


if __name__ == "__main__":
    main()
