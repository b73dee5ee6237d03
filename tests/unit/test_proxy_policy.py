"""The proxy's policy file: what a mistake in it says, and which class and key a request gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.proxy.policy import ClassifyError, Policy, PolicyError, load_policy
from sluicegate.proxy.template import KeyTemplate, TemplateError
from sluicegate.proxy.view import RequestView

POLICY = """\
classes:
  - name: health
    match: {path: [/healthz, /ready]}
    mode: pass
  - name: uploads
    match:
      method: [post, PUT]
      path: "/api/upload*"
    key: "{{{header:x-tenant}}}:uploads"
    cost: 5
    mode: acquire
    ttl_ms: 60000
    max_wait_ms: 250
    status: 503
  - name: partners
    match: {host: "*.partner.example", client_ip: [10.0.0.0/8, "2001:db8::/32"]}
    key: "partner:{host}"
  - name: tenants
    match: {headers: {x-tenant: "*", x-plan: "pro*"}}
    key: "tenant:{header:x-tenant}:{query:region}"
default:
  key: "ip:{client_ip}"
"""


def view(method: str = "GET", target: str = "/", ip: str = "192.0.2.1", **headers: str) -> RequestView:
    return RequestView.build(method, target, {k.replace("_", "-"): v for k, v in headers.items()}, ip)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return load_policy(path)


def test_the_first_matching_class_gives_the_key_cost_and_mode(policy: Policy) -> None:
    upload = view("POST", "/api/upload/1", x_tenant="acme", x_plan="pro")
    chosen = policy.classify(upload)
    assert (chosen.name, chosen.key_for(upload), chosen.cost, chosen.mode) == (
        "uploads",
        "{acme}:uploads",
        5,
        "acquire",
    )
    assert (chosen.ttl_ms, chosen.max_wait_ms, chosen.status) == (60000, 250, 503)
    tenant = view("GET", "/api/upload/1?region=eu", x_tenant="acme", x_plan="pro-2")
    chosen = policy.classify(tenant)
    assert (chosen.name, chosen.key_for(tenant), chosen.cost, chosen.mode) == ("tenants", "tenant:acme:eu", 1, "check")
    assert policy.classify(view(x_tenant="acme", x_plan="free")).name == "default"  # every header must match
    assert policy.classify(view(target="/ready")).mode == "pass"


def test_hosts_and_client_networks_match_as_written(policy: Policy) -> None:
    partner = view(ip="::ffff:10.1.2.3", host="API.Partner.Example:8443")  # an IPv4-mapped peer, a Host with a port
    chosen = policy.classify(partner)
    assert (chosen.name, chosen.key_for(partner)) == ("partners", "partner:api.partner.example")
    assert policy.classify(view(ip="2001:db8::7", host="x.partner.example")).name == "partners"
    assert policy.classify(view(ip="192.0.2.1", host="x.partner.example")).name == "default"
    chosen = policy.classify(view(ip="192.0.2.1"))
    assert chosen.key_for(view(ip="192.0.2.1")) == "ip:192.0.2.1"


@pytest.mark.parametrize("target", ["/api/%75pload/1", "/api/x/../upload/1", "/api/./upload"])
def test_encoded_or_dotted_paths_cannot_slip_past_a_class(policy: Policy, target: str) -> None:
    assert policy.classify(view("POST", target, x_tenant="a", x_plan="pro")).name == "uploads"


def test_a_key_longer_than_256_bytes_is_a_classify_error(policy: Policy) -> None:
    request = view(x_tenant="t" * 300, x_plan="pro")
    with pytest.raises(ClassifyError, match="longer than 256"):
        policy.classify(request).key_for(request)


def test_without_a_default_class_unmatched_requests_pass(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"classes": [{"match": {"path": "/a"}, "key": "a"}]}')
    policy = load_policy(path)
    assert policy.classify(view(target="/b")) is None
    assert policy.classify(view(target="/a")).name == "class1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("classes:\n  - match: {path: /a}\n    key: a\n    mode: lease\n", "4: classes[0].mode: must be one of"),
        ("classes:\n  - match: {path: /a}\n    key: a\n    cots: 2\n", "4: classes[0].cots: unknown field"),
        ("classes:\n  - match: {path: /a}\n    key: a\n    status: 500\n", "4: classes[0].status: must be 429 or 503"),
        ("classes:\n  - match: {path: /a}\n    key: a\n    cost: 0\n", "4: classes[0].cost: must be a whole number"),
        ("classes:\n  - match: {path: /a}\n    key: '{user}'\n", "3: classes[0].key: unknown placeholder {user}"),
        ("classes:\n  - match: {path: /a}\n", "2: classes[0]: mode check needs a key"),
        ("classes:\n  - key: a\n", "2: classes[0]: a class needs a match"),
        ("classes:\n  - match: {}\n    key: a\n", "2: classes[0].match: needs at least one of"),
        ("classes:\n  - match: {client_ip: 10.0.0.0/33}\n    key: a\n", "2: classes[0].match.client_ip: not an IP"),
        ("classes:\n  - match: {path: /a}\n    mode: pass\n    key: a\n", "4: classes[0].key: mode pass forwards"),
        ("classes:\n  - match: {path: /a}\n    key: a\n    ttl_ms: 5\n", "4: classes[0].ttl_ms: only mode acquire"),
        ("default: {key: a, match: {path: /a}}\n", "1: default: the default class takes every request"),
        (
            "classes:\n  - {name: x, match: {path: /a}, key: a}\n  - {name: x, match: {path: /b}, key: b}\n",
            "3: classes[1].name: two classes are named 'x'",
        ),
        ("default: {key: a}\ndefault: {key: b}\n", "2: 'default' is given twice"),
        ("classes: [\n", "2: not valid YAML"),
        ("", "1: the file is empty"),
        ("clases: []\n", "1: clases: unknown field"),
    ],
)
def test_a_bad_policy_says_which_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}:{message}")


def test_bad_json_says_which_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text('{\n  "default": {"key": "a",}\n}\n')
    with pytest.raises(PolicyError, match=r"policy\.json:2: not valid JSON"):
        load_policy(path)


def test_templates_take_literal_braces_and_leave_missing_values_empty() -> None:
    request = view(target="/p?q=1", x_a="one")
    assert KeyTemplate("{{x}}:{header:x-a}:{header:x-missing}:{query:q}").render(request) == "{x}:one::1"
    for bad in ("{", "}", "{nope}", "{header:}"):
        with pytest.raises(TemplateError):
            KeyTemplate(bad)
