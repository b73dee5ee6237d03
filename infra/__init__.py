"""The Sluicegate CDK app (``python -m infra.app``): constructs per deployable, one stack composing them."""
