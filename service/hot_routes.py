"""The compute routes, dispatched ahead of FastAPI's router.

Every POST that computes (``/lu_factor`` … ``/solve``, ``/v2/models/{model}/infer``
and its versioned form, ``/factorizations/{name}/solve`` and ``/unpack``) is sent
here straight to its endpoint. On a small request, FastAPI's route matching (every
route of every included router is tried in turn), its dependency solving and its
exception middleware cost about twice the request's own work: a profile of 8×8
``/solve`` at 16 clients put 48% of the event loop's time in FastAPI's routing and
28% in the endpoint (``bench.service``'s small-request table measures the effect).

The routes stay declared in FastAPI, which still serves everything else (OpenAPI,
405 for another method, HEAD, trailing slashes, the 404s). This layer only finds the
same route sooner, in the form the app serves it (after ``include_router``: its path,
its dependencies), and does what FastAPI would do for it: the API-key check (the
routes' one dependency, checked at construction), the call to the same endpoint with
the path parameters as strings, the same error answers
(:func:`service.errors.answer_error`; an error raised once the answer has started
is not answered again), and ``scope["route"]`` set to the route FastAPI would set,
at the point FastAPI's router would set it (after :class:`~service.middleware.RequestMiddleware`
admitted the request, so that a refusal there is ``unmatched`` in the metrics on
both paths).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterable
from typing import Any

from fastapi.routing import APIRoute
from starlette.convertors import StringConvertor
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import Message, Receive, Scope, Send

import lu_core
from service.auth import check_authorization, require_api_key
from service.errors import ServiceError, answer_error, from_core
from service.metrics import Metrics
from service.transport import header

__all__ = ["HotRoute", "HotRoutes", "hot_routes"]

# Where claim() leaves the matched route for __call__ (FastAPI's own keys are set only after admission).
_CLAIMED = "lu.hot_route"


class HotRoute:
    """One route as the app serves it: ``route`` is what FastAPI's router puts in ``scope["route"]``,
    ``served`` the form it calls (after ``include_router``: path, endpoint, dependencies)."""

    __slots__ = ("endpoint", "path", "path_regex", "route", "served")

    def __init__(self, route: APIRoute, served: Any) -> None:
        self.route = route
        self.served = served
        self.path: str = served.path
        self.path_regex = served.path_regex
        self.endpoint = served.endpoint


def _served(routes: Iterable[BaseRoute]) -> list[HotRoute]:
    """Every :class:`APIRoute` among ``routes`` (an app's ``app.router.routes``) with the form it is served in."""
    routes = list(routes)
    try:
        from fastapi.routing import iter_route_contexts  # FastAPI >= 0.16x: included routers are not copied
    except ImportError:  # pragma: no cover - older FastAPI: include_router copied each route into the app's
        return [HotRoute(r, r) for r in routes if isinstance(r, APIRoute)]
    contexts = iter_route_contexts(routes)
    return [HotRoute(c.original_route, c) for c in contexts if isinstance(c.original_route, APIRoute)]


def hot_routes(routes: Iterable[BaseRoute], endpoints: Collection[Any] | None = None) -> list[HotRoute]:
    """The POST routes among ``routes`` (an app's router's: the routes as FastAPI serves them), in the
    router's order, the ones :class:`HotRoutes` dispatches; ``endpoints``: only those routes' endpoints."""
    return [
        r for r in _served(routes) if r.served.methods == {"POST"} and (endpoints is None or r.endpoint in endpoints)
    ]


class HotRoutes:
    """The compute routes' shortcut: :meth:`claim` recognises a request for one of ``routes``, calling the
    instance serves a claimed request as FastAPI would.

    Raises ``TypeError`` at construction for a route it could not serve as FastAPI does:
    a dependency other than the API key, a parameter other than the request and
    string path parameters, or a body size limit of FastAPI's.
    """

    def __init__(self, routes: list[HotRoute], *, api_keys: tuple[bytes, ...], metrics: Metrics) -> None:
        self.api_keys = api_keys
        self.metrics = metrics
        self.exact: dict[str, HotRoute] = {}
        self.patterns: list[HotRoute] = []
        for route in routes:
            _check_servable(route.served)
            if route.served.param_convertors:
                self.patterns.append(route)
            else:
                self.exact.setdefault(route.path, route)  # the router takes the first of equal paths

    def claim(self, scope: Scope) -> bool:
        """Whether ``scope`` is a POST to one of the routes (then the route and its path parameters are
        kept for :meth:`__call__` under a key of this module's)."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return False  # a root_path: FastAPI's own path arithmetic applies
        path = scope["path"]
        route = self.exact.get(path)
        params: dict[str, str] = {}
        if route is None:
            for candidate in self.patterns:
                match = candidate.path_regex.match(path)
                if match is not None:
                    route, params = candidate, match.groupdict()
                    break
            else:
                return False
        scope[_CLAIMED] = (route, params)
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot, params = scope[_CLAIMED]
        # What FastAPI's router sets when it has matched the route (after the middleware admitted the request).
        scope["route"] = hot.route
        scope["endpoint"] = hot.endpoint
        scope["path_params"] = params
        request = Request(scope, receive, send)
        started = False

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            if self.api_keys:
                check_authorization(header(request, b"authorization") or "", self.api_keys)
            response = await hot.endpoint(request, **params)
            await response(scope, receive, sender)
        except (ServiceError, lu_core.LinAlgError) as exc:
            if started:  # as Starlette's exception wrapper: the answer cannot be replaced any more
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            error = exc if isinstance(exc, ServiceError) else from_core(exc)
            await answer_error(self.metrics, error)(scope, receive, sender)


def _check_servable(route: Any) -> None:
    calls = [d.call for d in route.dependant.dependencies]
    if calls != [require_api_key]:
        raise TypeError(f"{route.path}: dependencies {calls} are not the API key alone; HotRoutes would skip them")
    names = list(inspect.signature(route.endpoint).parameters)
    if names[:1] != ["request"] or set(names[1:]) != set(route.param_convertors):
        raise TypeError(f"{route.path}: parameters {names} are not (request, *path parameters)")
    if not all(isinstance(c, StringConvertor) for c in route.param_convertors.values()):
        raise TypeError(f"{route.path}: a path parameter is not a string")
    if getattr(route, "max_body_size", None) is not None:
        raise TypeError(f"{route.path}: FastAPI's max_body_size applies; HotRoutes would skip it")
