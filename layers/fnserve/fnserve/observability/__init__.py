"""What every transport and process tells of its work: ``logs`` and ``lines`` (structured logs, access lines),
``envelope`` (the request recorder, timing headers), ``metrics`` and ``gpu_metrics`` (Prometheus), ``tracing``
(OpenTelemetry), ``periodic`` (a flush on the event loop) and ``request_meta`` (a request's id and its
Server-Timing, for every transport)."""
