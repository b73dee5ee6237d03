"""Stage what the deployables ship: Lambda code folders, the bucket server's Docker context, a psycopg layer.

The CDK fingerprints a folder by its files' names and contents, so staging
the same sources gives the same asset hash and nothing is uploaded again.

Example:
    >>> staged = stage_assets(build_dir=Path("build/infra-assets"))  # doctest: +SKIP
    >>> sorted(p.name for p in staged.router.iterdir())  # doctest: +SKIP
    ['handler.py', 'sluicegate']
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORE = "sluicegate"
# The files of these folders are what each deployable adds to the core package.
FUNCTION_DIRS = {"router": "functions/router", "admin": "functions/admin", "bucket_server": "functions/bucket_server"}
# Never shipped: bytecode of this machine's Python, test and editor leftovers.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".pytest_cache", ".ruff_cache", "*.egg-info")
# The admin Lambda's PostgreSQL driver for Aurora: a binary wheel for Lambda's arm64 Python 3.12
# (Amazon Linux 2023, glibc 2.34, so manylinux_2_28 wheels run there).
PSYCOPG = "psycopg[binary]==3.3.9"
LAMBDA_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64")
LAMBDA_PYTHON = "3.12"


class AssetError(RuntimeError):
    """A deployable's sources are missing, or the psycopg layer could not be built."""


@dataclass(frozen=True, slots=True)
class StagedAssets:
    """Folders ready for ``Code.from_asset`` / ``DockerImageAsset``."""

    router: Path
    admin: Path
    bucket_server: Path


def stage_assets(*, build_dir: Path, repo: Path = REPO) -> StagedAssets:
    """Copy the core package and each function's files into ``build_dir/<name>`` (replacing old copies)."""
    staged = {}
    for name, relative in FUNCTION_DIRS.items():
        source = repo / relative
        if not source.is_dir() or not any(source.glob("*.py")):
            raise AssetError(f"{relative}/ has no Python files to deploy: the {name} deployable is missing")
        target = build_dir / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=IGNORED, copy_function=shutil.copyfile)
        shutil.copytree(repo / CORE, target / CORE, ignore=IGNORED, copy_function=shutil.copyfile)
        staged[name] = target
    return StagedAssets(**staged)


def psycopg_layer(*, build_dir: Path) -> Path:
    """A Lambda layer folder (``python/...``) with psycopg for arm64 Python 3.12, built once and cached.

    Building it downloads wheels from PyPI with pip (no Docker: the wheels are
    binary, nothing is compiled); later synths reuse the cached folder.
    """
    # No dots in the name: the CDK would keep the part after the last one as the asset folder's "extension".
    layer = build_dir / re.sub(r"[^a-z0-9]+", "-", f"layer {PSYCOPG} python{LAMBDA_PYTHON} arm64")
    if (layer / "python" / "psycopg").is_dir():
        return layer
    partial = layer.with_name(layer.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    command += ["--target", str(partial / "python"), "--implementation", "cp", "--python-version", LAMBDA_PYTHON]
    command += ["--only-binary=:all:", *(f"--platform={platform}" for platform in LAMBDA_PLATFORMS), PSYCOPG]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise AssetError(f"building the {PSYCOPG} layer for Aurora failed (needs PyPI once): {detail}") from exc
    shutil.rmtree(layer, ignore_errors=True)
    partial.rename(layer)  # only a complete layer is ever reused
    return layer
