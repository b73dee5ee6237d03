"""Context values: what `-c key=value` and cdk.json may say, and the errors for what they may not."""

from __future__ import annotations

import pytest

from infra.settings import DeploySettings, SettingsError

ZONE = {"domain": "quota.example.com", "hosted_zone": "Z0123456789ABCDEFGHIJ"}
CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/12345678-90ab-cdef-1234-567890abcdef"


def settings(**context: object) -> DeploySettings:
    return DeploySettings.from_context(context.get)


def test_defaults_are_four_partitions_behind_an_internal_alb_on_dynamodb() -> None:
    assert settings() == DeploySettings(partitions=4, front="alb", aurora=False, internet_facing=False)


def test_cli_strings_and_json_values_mean_the_same() -> None:
    from_cli = settings(partitions="16", aurora="true", internet_facing="false", front="alb")
    from_json = settings(partitions=16, aurora=True, internet_facing=False, front="alb")
    assert from_cli == from_json
    assert (from_cli.partitions, from_cli.aurora) == (16, True)
    assert settings(partitions="", front=None) == settings()  # empty means the default


@pytest.mark.parametrize(
    "context, message",
    [
        ({"partitions": "0"}, "context partitions=0: give 1 to 100"),
        ({"partitions": "101"}, "context partitions=101: give 1 to 100"),
        ({"partitions": "four"}, "context partitions='four': give a whole number"),
        ({"partitions": True}, "context partitions=True: give a whole number"),
        ({"front": "nlb"}, "context front='nlb': give one of alb, route53"),
        ({"aurora": "maybe"}, "context aurora='maybe': give true or false"),
        ({"front": "route53"}, "front=route53 needs domain and hosted_zone"),
        ({"domain": "quota.example.com"}, "domain and hosted_zone go together"),
        ({**ZONE, "hosted_zone": "example.com"}, "give a hosted zone id"),
        ({**ZONE, "domain": "Quota.Example.com"}, "give a lower-case DNS name"),
        ({"certificate_arn": "arn:aws:iam::123456789012:role/x"}, "give an ACM certificate ARN"),
        ({**ZONE, "front": "route53", "certificate_arn": CERTIFICATE}, "apply to front=alb only"),
        ({**ZONE, "front": "route53", "internet_facing": "true"}, "apply to front=alb only"),
    ],
)
def test_bad_values_are_named_with_what_to_give_instead(context: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings(**context)


def test_route53_with_its_zone_and_a_public_https_alb_are_valid() -> None:
    assert settings(front="route53", **ZONE).front == "route53"
    public = settings(internet_facing="yes", certificate_arn=CERTIFICATE, **ZONE)
    assert public.internet_facing and public.certificate_arn == CERTIFICATE
