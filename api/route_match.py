"""Which routes a request's path matches, for answers given before (or instead of) routing.

The router finds one route; two answers need all of them: the metrics label of a request that
was answered before routing (413, 408, a client gone mid-body), and the `Allow` header of a 405,
which must list every method of the path, not only those of the first route that matched it.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.routing import iter_route_contexts
from starlette.routing import compile_path
from starlette.types import Scope

__all__ = ["matching_routes"]


def matching_routes(scope: Scope) -> Iterator[tuple[str, frozenset[str]]]:
    """(path template, methods) of every route of the scope's app whose template matches its path."""
    app = scope.get("app")
    path = scope.get("path", "")
    for context in iter_route_contexts(getattr(getattr(app, "router", None), "routes", [])):
        if context.path is None:
            continue
        regex, _, _ = compile_path(context.path)
        if regex.match(path):
            yield context.path, frozenset(context.methods or ())
