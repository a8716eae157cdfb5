"""SQL over collections: sqlglot front end (parse), access paths over the converged index
(predicates, engine), DuckDB over Arrow for what is left (execute: the only DuckDB importer)."""
