"""Deployment settings from CDK context (``cdk.json`` or ``-c key=value``), validated once.

Example:
    >>> settings = DeploySettings.from_context({"partitions": "16", "front": "route53",
    ...     "domain": "quota.example.com", "hosted_zone": "Z0123456789ABCDEFGHIJ"}.get)
    >>> settings.partitions, settings.front, settings.aurora
    (16, 'route53', False)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields

FRONTS = ("alb", "route53")
# Each partition adds 3 CloudFormation resources (service, task definition, Cloud Map service): 100 partitions
# keep the largest variant near 370 resources, under CloudFormation's limit of 500 per stack.
MAX_PARTITIONS = 100
CONTEXT_KEYS = ("partitions", "front", "aurora", "domain", "hosted_zone", "certificate_arn", "internet_facing")

_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_ZONE_ID = re.compile(r"^Z[A-Z0-9]{1,31}$")
_CERTIFICATE = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")


class SettingsError(ValueError):
    """A context value we cannot deploy; the message names the key and what to give instead."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeploySettings:
    """What to deploy. Every field is a context key of the same name."""

    partitions: int = 4
    front: str = "alb"  # alb: ALB -> router Lambda; route53: DNS records for direct-mode SDKs
    aurora: bool = False  # the store: Aurora Serverless v2 PostgreSQL instead of DynamoDB
    domain: str = ""  # alb: an alias record for the ALB; route53: where the discovery records go
    hosted_zone: str = ""  # the Route53 hosted zone id that holds `domain`
    certificate_arn: str = ""  # alb: an ACM certificate for an HTTPS listener (HTTP then redirects)
    internet_facing: bool = False  # alb: a public load balancer (in public subnets) instead of an internal one

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_context(cls, get: Callable[[str], object]) -> DeploySettings:
        """Read every key with ``get`` (e.g. ``app.node.try_get_context``); ``None`` keeps the default.

        ``-c`` values arrive as strings, ``cdk.json`` values as JSON types: both are accepted.
        """
        defaults = {spec.name: spec.default for spec in fields(cls)}
        values: dict[str, object] = {}
        for key in CONTEXT_KEYS:
            raw = get(key)
            if raw is None or raw == "":
                continue
            default = defaults[key]
            if isinstance(default, bool):
                values[key] = _boolean(key, raw)
            elif isinstance(default, int):
                values[key] = _integer(key, raw)
            else:
                values[key] = str(raw).strip()
        return cls(**values)  # type: ignore[arg-type]

    def validate(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise SettingsError(f"context partitions={self.partitions}: give 1 to {MAX_PARTITIONS}")
        if self.front not in FRONTS:
            raise SettingsError(f"context front={self.front!r}: give one of {', '.join(FRONTS)}")
        if self.domain and not _DOMAIN.match(self.domain):
            raise SettingsError(f"context domain={self.domain!r}: give a lower-case DNS name like quota.example.com")
        if self.hosted_zone and not _ZONE_ID.match(self.hosted_zone):
            raise SettingsError(f"context hosted_zone={self.hosted_zone!r}: give a hosted zone id like Z0123456789ABC")
        if bool(self.domain) != bool(self.hosted_zone):
            raise SettingsError("context domain and hosted_zone go together: give both or neither")
        if self.certificate_arn and not _CERTIFICATE.match(self.certificate_arn):
            raise SettingsError(
                f"context certificate_arn={self.certificate_arn!r}: give an ACM certificate ARN "
                "(arn:aws:acm:REGION:ACCOUNT:certificate/ID)"
            )
        if self.front == "route53":
            if not self.domain:
                raise SettingsError("context front=route53 needs domain and hosted_zone (where the records go)")
            if self.certificate_arn or self.internet_facing:
                raise SettingsError("context certificate_arn and internet_facing apply to front=alb only")


def _boolean(key: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SettingsError(f"context {key}={raw!r}: give true or false")


def _integer(key: str, raw: object) -> int:
    if isinstance(raw, bool):  # bool is an int in Python, but `partitions=true` is a mistake
        raise SettingsError(f"context {key}={raw!r}: give a whole number")
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if not re.fullmatch(r"\d+", text):
        raise SettingsError(f"context {key}={raw!r}: give a whole number")
    return int(text)
