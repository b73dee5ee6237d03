"""The proxy's policy file: classes that map requests to a QoS key, a cost and an admission mode.

A policy is a YAML or JSON mapping with ``classes`` (a list, tried in order:
the first class whose ``match`` holds wins) and an optional ``default`` class
for requests no class matches (without one, they are forwarded unchecked)::

    classes:
      - name: health                 # optional, for logs
        match: {path: /healthz}
        mode: pass                   # forwarded without any check
      - name: uploads
        match:
          method: [POST, PUT]        # any of these
          path: "/upload/*"          # glob(s) on the decoded path
          host: "*.example.com"      # glob(s) on the Host, without its port
          headers: {x-tenant: "*"}   # each header present and its value matching the glob
          client_ip: [10.0.0.0/8]    # CIDR(s)
        key: "upload:{header:x-tenant}"
        cost: 5                      # default 1
        mode: acquire                # check (default) | acquire | pass
        ttl_ms: 60000                # acquire: the lease's time to live (default 30000)
        max_wait_ms: 250             # wait for room up to this long (default 0: answer at once)
        status: 503                  # the refusal's status: 429 (default) or 503
    default:
      key: "ip:{client_ip}"

Every condition of a ``match`` must hold; a list in a condition means any of
its items. Keys are templates (see :mod:`sluicegate.proxy.template`). Errors
name the file, line and field: ``policy.yaml:7: classes[1].mode: ...``.

Example:
    >>> from sluicegate.proxy.document import parse_document
    >>> policy = Policy.from_document(parse_document(
    ...     "classes:\\n  - {match: {path: '/api/*'}, key: 'api:{header:x-user}', cost: 2}\\n"
    ...     "default: {key: 'ip:{client_ip}'}\\n", "p.yaml"), "p.yaml")
    >>> from sluicegate.proxy.view import RequestView
    >>> chosen = policy.classify(RequestView.build("GET", "/api/x", {"x-user": "ann"}, "10.0.0.1"))
    >>> chosen.key_for(RequestView.build("GET", "/api/x", {"x-user": "ann"}, "10.0.0.1")), chosen.cost
    ('api:ann', 2)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from sluicegate.codec import MAX_COST
from sluicegate.patterns import glob_match
from sluicegate.proxy.document import DocumentError, Located, Section, load_document
from sluicegate.proxy.template import KeyTemplate, TemplateError
from sluicegate.proxy.view import RequestView
from sluicegate.rules import RuleError, validate_key

__all__ = ["ClassifyError", "Match", "Policy", "PolicyError", "QosClass", "load_policy"]

PolicyError = DocumentError  # what a bad policy file raises (its message starts with file:line:)
MODES = ("check", "acquire", "pass")
STATUSES = (429, 503)
DEFAULT_TTL_MS = 30_000
MAX_WAIT_MS = 600_000  # ten minutes: a longer wait is a queue, not admission control
MAX_TTL_MS = 2**32 - 1
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ClassifyError(ValueError):
    """A request whose key cannot be built (e.g. longer than 256 bytes); it gets a 400."""


@dataclass(frozen=True, slots=True)
class Match:
    """A class's conditions; every non-empty one must hold, any item of a list may."""

    hosts: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    methods: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    networks: tuple[Network, ...] = ()

    def matches(self, view: RequestView) -> bool:
        if self.methods and view.method not in self.methods:
            return False
        if self.paths and not any(glob_match(pattern, view.path) for pattern in self.paths):
            return False
        if self.hosts and not any(glob_match(pattern, view.host) for pattern in self.hosts):
            return False
        for name, pattern in self.headers:
            value = view.headers.get(name)
            if value is None or not glob_match(pattern, value):
                return False
        return not self.networks or any(view.client_ip in network for network in self.networks)


@dataclass(frozen=True, slots=True)
class QosClass:
    """How matching requests are admitted: the key template, cost, mode, wait and refusal status."""

    name: str
    match: Match | None  # None for the default class
    key: KeyTemplate | None  # None with mode "pass"
    cost: int = 1
    mode: str = "check"
    max_wait_ms: int = 0
    ttl_ms: int = DEFAULT_TTL_MS
    status: int = 429

    def key_for(self, view: RequestView) -> str:
        """The QoS key of ``view`` under this class; :class:`ClassifyError` if it is not a usable key."""
        assert self.key is not None, "mode pass has no key"
        key = self.key.render(view)
        try:
            return validate_key(key)
        except RuleError as exc:
            raise ClassifyError(f"class {self.name!r} cannot build a key for this request: {exc}") from exc


class Policy:
    """The classes in order and the default class (None: unmatched requests pass unchecked)."""

    def __init__(self, classes: list[QosClass], default: QosClass | None) -> None:
        self.classes = classes
        self.default = default

    def classify(self, view: RequestView) -> QosClass | None:
        for candidate in self.classes:
            if candidate.match is not None and candidate.match.matches(view):
                return candidate
        return self.default

    @property
    def modes(self) -> set[str]:
        """The admission modes the policy uses."""
        return {c.mode for c in [*self.classes, *([self.default] if self.default else [])]}

    @classmethod
    def from_document(cls, document: Located, source: str) -> Policy:
        top = Section(document, source, "")
        classes: list[QosClass] = []
        listed = top.take("classes")
        if listed is not None:
            if not isinstance(listed.value, list):
                raise top.error("must be a list of classes", listed, "classes")
            for index, item in enumerate(listed.value):
                classes.append(_qos_class(Section(item, source, f"classes[{index}]"), f"class{index + 1}", True))
        names = [c.name for c in classes]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise top.error(f"two classes are named {name!r}", listed.value[index], f"classes[{index}].name")
        default_section = top.section("default")
        default = None if default_section is None else _qos_class(default_section, "default", False)
        top.finish()
        return cls(classes, default)


def load_policy(path: Path) -> Policy:
    """Read and check a policy file; :data:`PolicyError` (``file:line: field: message``) if it is wrong."""
    return Policy.from_document(load_document(path), str(path))


def _qos_class(section: Section, default_name: str, needs_match: bool) -> QosClass:
    name = _text(section, "name") or default_name
    match_section = section.section("match")
    if needs_match and match_section is None:
        raise section.error("a class needs a match (use default for requests no class matches)")
    if not needs_match and match_section is not None:
        raise section.error("the default class takes every request no class matches: remove its match")
    match = None if match_section is None else _match(match_section)
    mode_field = section.take("mode")
    mode = "check" if mode_field is None else mode_field.value
    if mode not in MODES:
        raise section.error(f"must be one of {', '.join(MODES)}, got {mode!r}", mode_field, "mode")
    key_field = section.take("key")
    key = None
    if mode == "pass":
        for unused, found in [("key", key_field)] + [
            (n, section.take(n)) for n in ("cost", "max_wait_ms", "ttl_ms", "status")
        ]:
            if found is not None:
                raise section.error("mode pass forwards without a check: remove this field", found, unused)
    else:
        if key_field is None:
            raise section.error(f"mode {mode} needs a key (a template such as 'ip:{{client_ip}}')")
        key = _template(section, key_field)
    cost = _whole(section, "cost", 1, MAX_COST, 1)
    max_wait_ms = _whole(section, "max_wait_ms", 0, MAX_WAIT_MS, 0)
    ttl_field = section.take("ttl_ms")
    if ttl_field is not None and mode != "acquire":
        raise section.error("only mode acquire holds a lease with a time to live", ttl_field, "ttl_ms")
    ttl_ms = DEFAULT_TTL_MS if ttl_field is None else _whole_value(section, "ttl_ms", ttl_field, 1, MAX_TTL_MS)
    status_field = section.take("status")
    status = 429 if status_field is None else status_field.value
    if status not in STATUSES or isinstance(status, bool):
        raise section.error(f"must be 429 or 503, got {status!r}", status_field, "status")
    section.finish()
    return QosClass(name, match, key, cost, mode, max_wait_ms, ttl_ms, status)


def _match(section: Section) -> Match:
    hosts = tuple(host.lower() for host in _texts(section, "host"))
    paths = _texts(section, "path")
    methods = frozenset(method.upper() for method in _texts(section, "method"))
    headers: list[tuple[str, str]] = []
    header_section = section.section("headers")
    if header_section is not None:
        for header in header_section.names():
            headers.append((header.lower(), _text(header_section, header) or ""))
        header_section.finish()
    networks = []
    for text in _texts(section, "client_ip"):
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError as exc:
            raise section.error(f"not an IP address or CIDR: {text!r}", name="client_ip") from exc
    section.finish()
    if not (hosts or paths or methods or headers or networks):
        raise section.error("needs at least one of host, path, method, headers, client_ip")
    return Match(hosts, paths, methods, tuple(headers), tuple(networks))


def _template(section: Section, located: Located) -> KeyTemplate:
    if not isinstance(located.value, str) or not located.value:
        raise section.error("must be a non-empty text (a key template)", located, "key")
    try:
        template = KeyTemplate(located.value)
        if template.constant:
            validate_key(located.value.replace("{{", "{").replace("}}", "}"))
    except (TemplateError, RuleError) as exc:
        raise section.error(str(exc), located, "key") from exc
    return template


def _text(section: Section, name: str) -> str | None:
    located = section.take(name)
    if located is None:
        return None
    if isinstance(located.value, bool) or not isinstance(located.value, (str, int, float)):
        raise section.error(f"must be a text, got {located.value!r}", located, name)
    return str(located.value)


def _texts(section: Section, name: str) -> tuple[str, ...]:
    """A text or a non-empty list of texts."""
    located = section.take(name)
    if located is None:
        return ()
    items = located.value if isinstance(located.value, list) else [located]
    if not items:
        raise section.error("must not be an empty list", located, name)
    texts = []
    for item in items:
        if isinstance(item.value, bool) or not isinstance(item.value, (str, int, float)) or str(item.value) == "":
            raise section.error(f"must be a non-empty text or a list of them, got {item.value!r}", item, name)
        texts.append(str(item.value))
    return tuple(texts)


def _whole(section: Section, name: str, low: int, high: int, default: int) -> int:
    located = section.take(name)
    return default if located is None else _whole_value(section, name, located, low, high)


def _whole_value(section: Section, name: str, located: Located, low: int, high: int) -> int:
    value = located.value
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise section.error(f"must be a whole number from {low} to {high}, got {value!r}", located, name)
    return value
