"""Loading the Lambda entry points in-process, as the Lambda runtime does.

Each function's folder is its own task root (its modules import each other
by bare name), and settings are read at import (cold start), so every load
imports the handler afresh with the given environment.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
EVENTS = Path(__file__).resolve().parent / "events"
POWERTOOLS_ENV = {
    "POWERTOOLS_METRICS_NAMESPACE": "Sluicegate",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_DEV": "false",
    "AWS_REGION": "eu-west-1",
    "AWS_DEFAULT_REGION": "eu-west-1",
}


@dataclass
class LambdaContext:
    """What the Lambda runtime passes as ``context`` (the fields Powertools reads)."""

    function_name: str = "sluicegate-router"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:eu-west-1:123456789012:function:sluicegate-router"
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def event(name: str, **changes: Any) -> dict[str, Any]:
    """A recorded event from ``events/`` with top-level fields replaced."""
    recorded = json.loads((EVENTS / f"{name}.json").read_text())
    recorded.update(changes)
    return recorded


@pytest.fixture
def load_function(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModuleType]]:
    """Factory: ``load_function("router", SLUICEGATE_X=...)`` imports ``functions/router/handler.py`` cold."""
    loaded: list[ModuleType] = []

    def load(name: str, **env: str) -> ModuleType:
        for variable in [*POWERTOOLS_ENV, *env]:
            monkeypatch.delenv(variable, raising=False)
        for variable in list(os.environ):
            if variable.startswith("SLUICEGATE_"):
                monkeypatch.delenv(variable)
        for variable, value in {**POWERTOOLS_ENV, "POWERTOOLS_SERVICE_NAME": f"sluicegate-{name}", **env}.items():
            monkeypatch.setenv(variable, value)
        folder = FUNCTIONS / name
        _forget_modules(folder)
        monkeypatch.syspath_prepend(str(folder))
        module = importlib.import_module("handler")
        loaded.append(module)
        return module

    yield load
    for module in loaded:
        client = getattr(module, "client", None)
        if client is not None:
            client.close()
        loop = getattr(module, "loop", None)
        if loop is not None:
            loop.close()
    for name in ("router", "admin"):
        _forget_modules(FUNCTIONS / name)


def _forget_modules(folder: Path) -> None:
    # Both functions have a module called `handler`: drop whichever was imported last.
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if origin.startswith(str(folder.parent)) and not origin.startswith(str(FUNCTIONS.parent / "sluicegate")):
            del sys.modules[name]
