"""The engine's thread: a request the engine refuses is answered 400, a bug in one request 500, and the thread
goes on serving (no model needed)."""

from __future__ import annotations

import asyncio

from jaxlab.errors import InvalidRequestError
from jaxlab.serve.worker import EngineWorker


class RefusingEngine:
    has_work = False

    def add_request(self, request_id, prompt_ids, **kwargs):
        if prompt_ids == [0]:
            raise InvalidRequestError("the request needs 99 pages, the pool holds 8")
        raise RuntimeError("a bug")


def test_refused_and_broken_requests_get_their_status_and_the_thread_goes_on():
    async def main():
        worker = EngineWorker(RefusingEngine()).start()
        try:
            refused = await asyncio.wait_for(worker.submit("a", [0]).get(), 10)
            broken = await asyncio.wait_for(worker.submit("b", [1]).get(), 10)
            return refused, broken, worker.alive, worker.in_flight
        finally:
            worker.stop()

    refused, broken, alive, in_flight = asyncio.run(main())
    assert (refused.finished, refused.status, refused.reason) == (True, 400, "error") and "pages" in refused.error
    assert (broken.status, broken.error) == (500, "RuntimeError: a bug")
    assert alive and in_flight == 0
