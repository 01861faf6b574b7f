"""What a server on this machine owes the web pages its user opens: an ASGI layer in front of every endpoint.

A browser lets any page send a "simple" request (a ``text/plain`` POST) to ``http://127.0.0.1:8000`` and, through
DNS rebinding, a page of ``attacker.example`` can even read the answer: its name resolves to 127.0.0.1 and the
request arrives with ``Host: attacker.example``. So, before a request reaches the app:

* **Host allow-list**: the ``Host`` header must name this machine's loopback (``localhost``, ``127.0.0.1``,
  ``::1``), the address the server was bound to (unless a wildcard), or a name of ``--allowed-hosts`` (``*``:
  any); else 400 ``host_not_allowed``.
* **Cross-origin requests refused**: a request whose ``Origin`` is not the server's own (the chat page's) is
  answered 403 ``cross_origin_refused``, unless ``--cors ORIGIN`` names that origin; then it gets CORS headers,
  its preflight (``OPTIONS``) included.
* **Headers**: every response says ``X-Content-Type-Options: nosniff``; the chat page adds its own policy
  (:data:`PAGE_HEADERS`).
"""

from __future__ import annotations

from jaxlab.serve.protocol import ApiError

LOOPBACK = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
#: The chat page's headers: it runs its own inline script and talks to this server only; no page may frame it
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' "
    "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def host_name(host: str) -> str:
    """``Host`` header -> its name without the port: "127.0.0.1:8000" -> "127.0.0.1", "[::1]:80" -> "::1"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(bound: str, extra=()) -> frozenset[str]:
    """The names a request's ``Host`` may give: loopback, the bound address (not a wildcard), and ``extra``."""
    names = set(LOOPBACK) | {h.strip().lower() for h in extra if h.strip()}
    if bound not in WILDCARDS:
        names.add(host_name(bound) if not bound.count(":") > 1 else bound.lower())
    return frozenset(names)


class Hardening:
    """The ASGI layer (Starlette ``Middleware(Hardening, hosts=..., cors=...)``)."""

    def __init__(self, app, hosts: frozenset[str], cors: tuple[str, ...] = ()):
        self.app, self.hosts, self.cors = app, hosts, tuple(o.rstrip("/").lower() for o in cors)

    def check(self, scope, headers: dict) -> tuple[ApiError | None, str | None]:
        """(a refusal or None, the origin to grant CORS headers or None)."""
        host = headers.get("host", "")
        if "*" not in self.hosts and host_name(host) not in self.hosts:
            return ApiError(
                400,
                f"the Host header {host[:80]!r} is not a name this server answers to (DNS rebinding guard): "
                "use http://127.0.0.1 or localhost, or start the server with --allowed-hosts NAME",
                code="host_not_allowed",
            ), None
        origin = headers.get("origin")
        if origin is None:
            return None, None
        origin = origin.rstrip("/").lower()
        own = f"{scope.get('scheme', 'http')}://{host.lower()}"
        if origin == own:
            return None, None
        if origin in self.cors or "*" in self.cors:
            return None, origin
        return ApiError(
            403,
            f"cross-origin requests are refused (from {origin[:80]!r}): start the server with --cors {origin[:80]} to "
            "let that page call it",
            code="cross_origin_refused",
        ), None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal, grant = self.check(scope, headers)
        extra = [(b"x-content-type-options", b"nosniff")]
        if grant is not None:
            extra += [(b"access-control-allow-origin", grant.encode("latin-1")), (b"vary", b"Origin")]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + extra)
            await send(message)

        if refusal is not None:
            from starlette.responses import JSONResponse

            response = JSONResponse(refusal.body(), status_code=refusal.status)
            return await response(scope, receive, send_with_headers)
        if grant is not None and scope["method"] == "OPTIONS":  # the preflight of an allowed origin
            extra += [
                (b"access-control-allow-methods", b"GET, POST"),
                (b"access-control-allow-headers", b"Authorization, Content-Type"),
                (b"access-control-max-age", b"600"),
            ]
            from starlette.responses import Response

            return await Response(status_code=204)(scope, receive, send_with_headers)
        await self.app(scope, receive, send_with_headers)
