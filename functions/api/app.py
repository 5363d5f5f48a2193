"""HTTP inference function: API Gateway / ALB -> Open Inference Protocol V2 on the fnserve layer."""

from fnserve.adapters.lambda_.http import create_handler

# Built once per container at import: settings, warm model registry, app, Mangum.
handler = create_handler()
