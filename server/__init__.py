"""The rtindex service (installed as ``rtindex.server``): ``rtindex serve``.

One ingest process owns the data directory (the writer) and serves writes on a private
Unix socket; N query processes open the same directory with ``role="reader"``, share the
public port, answer queries and reads themselves, and relay write requests, bytes
unparsed, to the ingest process. See docs/service.md for the picture.

Modules: ``routes`` (the route table: role and process of each route), ``config``
(options and limits), ``auth`` (API keys), ``admission`` (the
query-admission ASGI layer), ``shedding`` (refusals in the HTTP protocol, and the
event-loop lag that sheds load), ``http`` (JSON replies and errors), ``metrics``,
``ingest_app`` and ``query_app`` (the two kinds of process), ``relay`` (query process ->
ingest process), ``supervisor`` (starts, watches and stops them), ``worker`` (a child's
entry point).
"""
