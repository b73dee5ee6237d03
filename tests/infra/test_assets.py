"""What the deployables ship: the staged Lambda code and Docker context, as copied into the cloud assembly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from infra.assets import REPO, AssetError, stage_assets
from tests.infra.conftest import Synthesized


def files_under(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


def shipped_core() -> set[str]:
    """The core package as a user's checkout has it, without bytecode."""
    return {f"sluicegate/{name}" for name in files_under(REPO / "sluicegate") if "__pycache__" not in name}


def function_files(name: str) -> set[str]:
    return {path for path in files_under(REPO / "functions" / name) if "__pycache__" not in path}


def lambda_asset(variant: Synthesized, service: str) -> Path:
    (function,) = [
        r["Properties"]
        for r in variant.resources("AWS::Lambda::Function").values()
        if r["Properties"]["Environment"]["Variables"].get("POWERTOOLS_SERVICE_NAME") == service
    ]
    return variant.asset_dir(function["Code"]["S3Key"].removesuffix(".zip"))


@pytest.fixture(scope="module")
def alb(synthesize: Callable[[str], Synthesized]) -> Synthesized:
    return synthesize("alb-4-aurora")


@pytest.mark.parametrize("service, folder", [("sluicegate-router", "router"), ("sluicegate-admin", "admin")])
def test_lambda_asset_is_the_core_package_plus_the_handler(alb: Synthesized, service: str, folder: str) -> None:
    shipped = files_under(lambda_asset(alb, service))
    assert "handler.py" in shipped
    assert shipped == shipped_core() | function_files(folder)
    assert not any(part in ("tests", "infra", "__pycache__") for name in shipped for part in name.split("/"))
    assert not any(name.endswith((".pyc", ".db", "Dockerfile")) for name in shipped)


def test_docker_context_holds_only_what_the_image_needs(alb: Synthesized) -> None:
    (image,) = alb.assets_manifest()["dockerImages"].values()
    assert image["source"]["platform"] == "linux/arm64"
    context = alb.outdir / image["source"]["directory"]
    shipped = files_under(context)
    assert {"Dockerfile", "healthcheck.py", "requirements.txt", "sluicegate/server/__main__.py"} <= shipped
    assert shipped == shipped_core() | function_files("bucket_server")
    assert not any(name.startswith(("tests/", "infra/", "functions/")) or "__pycache__" in name for name in shipped)


def test_aurora_admin_gets_psycopg_for_lambdas_arm64_python(alb: Synthesized) -> None:
    (layer,) = alb.props("AWS::Lambda::LayerVersion")
    assert layer["CompatibleArchitectures"] == ["arm64"] and layer["CompatibleRuntimes"] == ["python3.12"]
    shipped = files_under(alb.asset_dir(layer["Content"]["S3Key"].removesuffix(".zip")))
    assert "python/psycopg/__init__.py" in shipped
    binaries = [name for name in shipped if name.startswith("python/psycopg_binary/") and name.endswith(".so")]
    assert binaries and all(name.endswith("cpython-312-aarch64-linux-gnu.so") for name in binaries)


def test_a_missing_deployable_is_named(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "functions" / "router").mkdir(parents=True)
    (repo / "functions" / "router" / "handler.py").write_text("def handler(event, context): ...\n")
    (repo / "sluicegate").mkdir()
    with pytest.raises(AssetError, match="functions/admin/ has no Python files"):
        stage_assets(build_dir=tmp_path / "build", repo=repo)


def test_restaging_drops_files_deleted_from_the_sources(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("router", "admin", "bucket_server"):
        (repo / "functions" / name).mkdir(parents=True)
        (repo / "functions" / name / "handler.py").write_text("")
    (repo / "sluicegate").mkdir()
    (repo / "sluicegate" / "old.py").write_text("")
    stage_assets(build_dir=tmp_path / "build", repo=repo)
    (repo / "sluicegate" / "old.py").unlink()
    staged = stage_assets(build_dir=tmp_path / "build", repo=repo)
    assert files_under(staged.router) == {"handler.py"}
