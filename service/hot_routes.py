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
same :class:`~fastapi.routing.APIRoute` sooner and does what FastAPI would do for it:
the API-key check (the routes' one dependency, checked at construction), the call to
the same endpoint with the path parameters as strings, the same error answers
(:func:`service.errors.answer_error`), and ``scope["route"]`` set to the route, so
that metrics and logs name the same endpoint.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from fastapi.routing import APIRoute
from starlette.convertors import StringConvertor
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

import lu_core
from service.auth import check_authorization, require_api_key
from service.errors import ServiceError, answer_error, from_core
from service.metrics import Metrics
from service.transport import header

__all__ = ["HotRoutes", "hot_routes"]


def hot_routes(routes: Iterable[Any]) -> list[APIRoute]:
    """The POST routes among ``routes`` (a router's), the ones :class:`HotRoutes` dispatches."""
    return [r for r in routes if isinstance(r, APIRoute) and r.methods == {"POST"}]


class HotRoutes:
    """The compute routes' shortcut: :meth:`claim` recognises a request for one of ``routes``, calling the
    instance serves a claimed request as FastAPI would.

    Raises ``TypeError`` at construction for a route it could not serve as FastAPI does:
    a dependency other than the API key, or a parameter other than the request and
    string path parameters.
    """

    def __init__(self, routes: list[APIRoute], *, api_keys: tuple[bytes, ...], metrics: Metrics) -> None:
        self.api_keys = api_keys
        self.metrics = metrics
        self.exact: dict[str, APIRoute] = {}
        self.patterns: list[APIRoute] = []
        for route in routes:
            _check_servable(route)
            if route.param_convertors:
                self.patterns.append(route)
            else:
                self.exact[route.path] = route

    def claim(self, scope: Scope) -> bool:
        """Whether ``scope`` is a POST to one of the routes (then ``scope["route"]``, its path parameters are set)."""
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
        scope["route"] = route
        scope["path_params"] = params
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            if self.api_keys:
                check_authorization(header(request, b"authorization") or "", self.api_keys)
            response = await scope["route"].endpoint(request, **scope["path_params"])
        except ServiceError as exc:
            response = answer_error(self.metrics, exc)
        except lu_core.LinAlgError as exc:
            response = answer_error(self.metrics, from_core(exc))
        await response(scope, receive, send)


def _check_servable(route: APIRoute) -> None:
    calls = [d.call for d in route.dependant.dependencies]
    if calls != [require_api_key]:
        raise TypeError(f"{route.path}: dependencies {calls} are not the API key alone; HotRoutes would skip them")
    names = list(inspect.signature(route.endpoint).parameters)
    if names[:1] != ["request"] or set(names[1:]) != set(route.param_convertors):
        raise TypeError(f"{route.path}: parameters {names} are not (request, *path parameters)")
    if not all(isinstance(c, StringConvertor) for c in route.param_convertors.values()):
        raise TypeError(f"{route.path}: a path parameter is not a string")
