"""The layer in front of every endpoint (no model needed): the Host allow-list against DNS rebinding, cross-origin
requests refused unless allowed, and the headers every response carries."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from jaxlab.serve.hardening import Hardening, allowed_hosts, host_name


@pytest.mark.parametrize(
    "host, name",
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:8000", "::1"),
        ("::1", "::1"),
        ("a.b", "a.b"),
    ],
)
def test_host_name(host, name):
    assert host_name(host) == name


def test_allowed_hosts_are_loopback_the_bound_address_and_the_extra_names():
    assert allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("0.0.0.0") == {"localhost", "127.0.0.1", "::1"}  # a wildcard names no host
    assert "192.168.1.5" in allowed_hosts("192.168.1.5") and "box.lan" in allowed_hosts("0.0.0.0", ["Box.lan", " "])


def client(hosts=("127.0.0.1",), cors=()):
    async def echo(request):
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route("/", echo, methods=["GET", "POST"])],
        middleware=[Middleware(Hardening, hosts=allowed_hosts("127.0.0.1", hosts), cors=cors)],
    )
    return TestClient(app, base_url="http://127.0.0.1:8000")


def test_a_request_for_another_host_name_is_refused():
    c = client()
    ok = c.get("/")
    assert ok.status_code == 200 and ok.headers["x-content-type-options"] == "nosniff"
    r = c.get("/", headers={"Host": "attacker.example"})  # a rebound name that resolves to 127.0.0.1
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    assert "--allowed-hosts" in r.json()["error"]["message"] and r.headers["x-content-type-options"] == "nosniff"
    assert client(hosts=("*",)).get("/", headers={"Host": "anything.example"}).status_code == 200


def test_cross_origin_requests_are_refused_unless_allowed():
    c = client(cors=("http://ok.example",))
    simple = {"Content-Type": "text/plain"}
    r = c.post("/", content="{}", headers={**simple, "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin_refused"
    assert "--cors http://evil.example" in r.json()["error"]["message"]
    assert c.post("/", content="{}", headers={**simple, "Origin": "http://127.0.0.1:8000"}).status_code == 200  # own
    r = c.post("/", content="{}", headers={**simple, "Origin": "http://ok.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ok.example"
    pre = c.options("/", headers={"Origin": "http://ok.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and "Authorization" in pre.headers["access-control-allow-headers"]
