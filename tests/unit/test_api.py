"""The HTTP-agnostic check API: input parsing helpers, routing answers, futures of pipelined checks."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import pytest

from sluicegate.router.api import (
    BadRequest,
    CheckApi,
    HttpRequest,
    HttpResponse,
    ascii_digits,
    parse_cost,
    parse_json_body,
)
from sluicegate.router.client import Decision, PartitionClient
from sluicegate.router.http import serve_http

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        ("4294967295", 4294967295),
        ("", None),
        (" 1", None),
        ("-1", None),
        ("1.0", None),
        ("\u00b2", None),  # superscript two: isdigit() is True
        ("\u0661", None),  # Arabic-Indic one: int() accepts it, HTTP does not
        ("1_000", None),
        ("9" * 5000, None),  # more digits than int() accepts
    ],
    ids=lambda value: repr(value)[:20] if isinstance(value, str) else str(value)[:20],
)
def test_ascii_digits(text: str, number: int | None) -> None:
    assert ascii_digits(text) == number


def test_cost_with_more_digits_than_int_accepts_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="positive whole number"):
        parse_cost("9" * 5000)


@pytest.mark.parametrize("body", [DEEP, b'{"checks": ' + DEEP + b"}"], ids=["array", "inside-checks"])
def test_deeply_nested_json_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_json_body(body)


def call(api: CheckApi, request: HttpRequest) -> HttpResponse:
    async def handle() -> HttpResponse:
        result = api.handle(request)
        return await result if inspect.isawaitable(result) else result

    return asyncio.run(asyncio.wait_for(handle(), 5))


@pytest.fixture
def api() -> CheckApi:
    return CheckApi(PartitionClient([("127.0.0.1", 9)]))  # never started: these requests do not reach it


def test_deeply_nested_batch_is_400_not_500(api: CheckApi) -> None:
    response = call(api, HttpRequest("POST", "/v1/check", body=DEEP))
    assert response.status == 400
    assert "nested too deeply" in json.loads(response.body)["error"]


def test_huge_cost_in_the_query_is_400(api: CheckApi) -> None:
    response = call(api, HttpRequest("GET", "/v1/check/alice", query="cost=" + "9" * 5000))
    assert response.status == 400


def test_wrong_method_on_a_key_allows_get_and_head(api: CheckApi) -> None:
    response = call(api, HttpRequest("POST", "/v1/check/alice"))
    assert response.status == 405
    assert ("Allow", "GET, HEAD") in response.headers


class FakeClient:
    """Hands out futures the test resolves (or fails, or cancels) by key."""

    addresses = [("127.0.0.1", 9)]

    def __init__(self) -> None:
        self.futures: dict[str, asyncio.Future[Decision]] = {}

    def submit(self, key: str, cost: int = 1) -> asyncio.Future[Decision]:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.futures[key] = future
        return future


def fake_api() -> tuple[CheckApi, FakeClient]:
    client = FakeClient()
    return CheckApi(client), client  # type: ignore[arg-type]


def test_failed_check_fails_its_response_future() -> None:
    async def main() -> None:
        api, client = fake_api()
        mapped: Any = api.handle(HttpRequest("GET", "/v1/check/a"))
        client.futures["a"].set_exception(OSError("link closed"))
        with pytest.raises(OSError, match="link closed"):
            await asyncio.wait_for(mapped, 1)

    asyncio.run(main())


def test_cancelled_check_cancels_its_response_future() -> None:
    async def main() -> None:
        api, client = fake_api()
        mapped: Any = api.handle(HttpRequest("GET", "/v1/check/a"))
        client.futures["a"].cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(mapped, 1)
        assert mapped.cancelled()

    asyncio.run(main())


@pytest.mark.parametrize("fail", ["exception", "cancel"])
def test_a_failed_check_does_not_stall_the_pipelined_answers_after_it(fail: str) -> None:
    async def main() -> None:
        api, client = fake_api()
        server = await serve_http(api.handle, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        try:
            writer.write(b"GET /v1/check/a HTTP/1.1\r\n\r\nGET /v1/check/b HTTP/1.1\r\n\r\n")
            while len(client.futures) < 2:
                await asyncio.sleep(0.01)
            client.futures["b"].set_result(Decision("b", True, 4, 0, capacity=5, window_ms=5000))
            if fail == "cancel":
                client.futures["a"].cancel()
            else:
                client.futures["a"].set_exception(RuntimeError("boom"))
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert first.startswith(b"HTTP/1.1 500 ")
            length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert second.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
            await server.shutdown(0.1)

    asyncio.run(main())
