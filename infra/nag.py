"""cdk-nag AwsSolutions checks and the one way we acknowledge a finding: with a reason.

Example:
    >>> acknowledge(table, "AwsSolutions-DDB3",
    ...             "checkpoints expire within minutes, so restoring old ones would be wrong")  # doctest: +SKIP
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

PLUGIN = "AwsSolutions"
MIN_REASON_WORDS = 8  # a reason says why the finding does not apply here, not just "ok"
# AWS-managed policies the CDK attaches to Lambda roles: scoped by AWS to logging and ENI management.
LAMBDA_BASIC_POLICY = "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
LAMBDA_VPC_POLICY = "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"


def add_checks(scope: IConstruct) -> AwsSolutionsChecks:
    """Run AwsSolutions on every stack of ``scope`` (an App or Stage) at synth; findings stop the synth."""
    checks = AwsSolutionsChecks(scope, verbose=True)
    Validations.of(scope).add_plugins(checks)
    return checks


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    """Accept one finding (``RuleId`` or ``RuleId[detail]``) on ``construct`` and its children, saying why."""
    if len(reason.split()) < MIN_REASON_WORDS:
        raise ValueError(f"acknowledging {finding}: give a real reason, not {reason!r}")
    # Prefixed with the plugin's name, as the validation report asks (a bare id would mean a CDK annotation).
    Validations.of(construct).acknowledge(Acknowledgment(id=f"{PLUGIN}::{finding}", reason=reason))


def acknowledge_lambda_role(function: IConstruct, *, in_vpc: bool) -> None:
    """The findings every Lambda role of ours has, for the same reasons."""
    acknowledge(
        function,
        f"AwsSolutions-IAM4[{LAMBDA_BASIC_POLICY}]",
        "AWS-managed policy that only lets the function write its own CloudWatch Logs",
    )
    if in_vpc:
        acknowledge(
            function,
            f"AwsSolutions-IAM4[{LAMBDA_VPC_POLICY}]",
            "AWS-managed policy Lambda needs to create and delete its network interfaces in our subnets",
        )
