"""The service's one route table: each route's method, path, role needed and serving process.

The ingest process serves exactly its rows of the table, a query process relays exactly
those rows to it and serves the others itself, and the key check of every request reads its
role here: a route is added, relayed and guarded in one edit, or not at all. Paths are
Starlette templates, matched by the same compiled patterns the routers use: a request
routed to a row is checked against that row's role, whatever its path holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.convertors import PathConvertor, register_url_convertor
from starlette.routing import compile_path

INGEST = "ingest"
QUERY = "query"
DOCS_ASSETS = "/docs-assets"  # the scripts and styles of /docs and /redoc (open, like them)
# the role a request no row matches needs: any valid key (the router then answers 404 or 405)
UNLISTED_ROLE = "read"


class RestConvertor(PathConvertor):
    """``{doc_id:rest}``: the rest of the path, line breaks included. ``:path`` stops at a
    line break, and its pattern's end matches before a final one, so a document id ending
    in a line break (which rtindex accepts) would name the id without it."""

    regex = "(?s:.*)"


register_url_convertor("rest", RestConvertor())


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # a Starlette path template
    role: str | None  # the least role of the key it needs (server/auth.py), None: open to anyone
    process: str  # INGEST or QUERY
    name: str  # its handler's name (the ingest process's IngestService method; the OpenAPI route name)


ROUTES: tuple[Endpoint, ...] = (
    # served by a query process
    Endpoint("GET", "/healthz", None, QUERY, "healthz"),
    Endpoint("GET", "/openapi.json", None, QUERY, "openapi"),
    Endpoint("GET", "/docs", None, QUERY, "custom_swagger_ui_html"),
    Endpoint("GET", "/docs/oauth2-redirect", None, QUERY, "swagger_ui_redirect"),
    Endpoint("GET", "/redoc", None, QUERY, "redoc_html"),
    Endpoint("GET", DOCS_ASSETS + "/{path:path}", None, QUERY, "static-offline-docs"),
    Endpoint("GET", "/metrics", "read", QUERY, "get_metrics"),
    Endpoint("POST", "/v1/query", "read", QUERY, "query"),
    Endpoint("POST", "/v1/orgs/self/queries", "read", QUERY, "rockset_query"),
    Endpoint("POST", "/v1/noop", "read", QUERY, "noop"),
    Endpoint("GET", "/v1/collections", "read", QUERY, "list_collections"),
    Endpoint("GET", "/v1/collections/{name}/docs/{doc_id:rest}", "read", QUERY, "get_doc"),
    Endpoint("GET", "/v1/keys", "admin", QUERY, "list_keys"),
    Endpoint("POST", "/v1/keys", "admin", QUERY, "create_key"),
    Endpoint("DELETE", "/v1/keys/{key_id}", "admin", QUERY, "revoke_key"),
    # served by the ingest process (relayed to it by the query processes)
    Endpoint("POST", "/v1/collections", "admin", INGEST, "create_collection"),
    Endpoint("DELETE", "/v1/collections/{name}", "admin", INGEST, "drop_collection"),
    Endpoint("POST", "/v1/collections/{name}/docs", "write", INGEST, "post_docs"),
    Endpoint("PATCH", "/v1/collections/{name}/docs/{doc_id:rest}", "write", INGEST, "patch_doc"),
    Endpoint("DELETE", "/v1/collections/{name}/docs/{doc_id:rest}", "write", INGEST, "delete_doc"),
    Endpoint("POST", "/v1/collections/{name}/sources", "admin", INGEST, "add_source"),
    Endpoint("GET", "/v1/collections/{name}/sources", "read", INGEST, "list_sources"),
    Endpoint("GET", "/v1/collections/{name}/sources/{source}", "read", INGEST, "get_source"),
    Endpoint("POST", "/v1/collections/{name}/sources/{source}/pause", "admin", INGEST, "pause_source"),
    Endpoint("POST", "/v1/collections/{name}/sources/{source}/resume", "admin", INGEST, "resume_source"),
    Endpoint("DELETE", "/v1/collections/{name}/sources/{source}", "admin", INGEST, "remove_source"),
    Endpoint("GET", "/v1/collections/{name}/transformation", "read", INGEST, "get_transformation"),
    Endpoint("PUT", "/v1/collections/{name}/transformation", "admin", INGEST, "set_transformation"),
    Endpoint("DELETE", "/v1/collections/{name}/transformation", "admin", INGEST, "remove_transformation"),
    Endpoint("POST", "/v1/orgs/self/ws/{ws}/collections", "admin", INGEST, "rockset_create"),
    Endpoint("POST", "/v1/orgs/self/ws/{ws}/collections/{coll}/docs", "write", INGEST, "rockset_docs"),
    Endpoint("PATCH", "/v1/orgs/self/ws/{ws}/collections/{coll}/docs", "write", INGEST, "rockset_patch"),
)


def served_by(process: str) -> list[Endpoint]:
    return [r for r in ROUTES if r.process == process]


# every request looks its role up: a plain path by a dict (most requests), any other by the
# patterns of every row, plain ones included (a pattern matches more than its plain path: its
# end also matches before a final line break)
_PLAIN = {(r.method, r.path): r for r in ROUTES if "{" not in r.path}
_PATTERNS = [(r, compile_path(r.path)[0]) for r in ROUTES]


def endpoint_of(method: str, path: str) -> Endpoint | None:
    """The row a request is routed to, or None. HEAD is looked up as GET (the routers answer
    HEAD where they serve GET)."""
    if method == "HEAD":
        method = "GET"
    found = _PLAIN.get((method, path))
    if found is not None:
        return found
    for r, pattern in _PATTERNS:
        if r.method == method and pattern.match(path):
            return r
    return None


def required_role(method: str, path: str) -> str | None:
    """Who may make a request: None (anyone), "read", "write" or "admin"."""
    r = endpoint_of(method, path)
    return r.role if r is not None else UNLISTED_ROLE


OPEN_PATHS = frozenset(r.path for r in ROUTES if r.role is None and "{" not in r.path)
