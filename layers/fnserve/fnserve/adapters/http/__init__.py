"""The V2 HTTP API: ``app`` (routes and ``create_app``), ``middleware`` (request ids, errors), ``openapi`` (docs)."""
