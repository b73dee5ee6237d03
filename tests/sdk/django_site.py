"""A Django project in one module for the middleware tests: settings once, then views and URLs per test module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

urlpatterns: list[Any] = []


def install(views: dict[str, Callable[..., Any]]) -> None:
    """Configure Django (once per process) and serve ``views`` at their routes."""
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="sdk-tests-only",
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    from django.urls import clear_url_caches, path

    urlpatterns[:] = [path(route, view) for route, view in views.items()]
    clear_url_caches()
