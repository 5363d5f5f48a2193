"""HTTP inference function on Google Cloud: the Open Inference Protocol V2, as the Lambda one serves it."""

import functions_framework.aio

from fnserve.adapters.gcp.http import create_function

# Built once per instance at import: settings, warm model registry, the V2 app.
infer = functions_framework.aio.http(create_function())
