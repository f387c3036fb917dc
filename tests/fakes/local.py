"""The HTTP server a fake API runs on 127.0.0.1 (a free port), while in `async with`: the
lifecycle the model fakes (gemini.py, anthropic.py) share."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from aiohttp import web


class LocalServer:
    """Every path and method answered by `_handle`; `base_url` says where, once entered."""

    base_url = ""
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
