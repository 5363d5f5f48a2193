"""Run under the Lambda runtime's Python (3.12) with only the built artifacts on sys.path:
import a built function's app.py, pass it one event, print the response as JSON.

    python3.12 invoke_built.py FUNCTION_DIR EVENT_FILE     (PYTHONPATH: built layer, boto3)
"""

import json
import sys
import time
import uuid


class Context:
    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = "built"
        self.function_version = "1"
        self.memory_limit_in_mb = 2048
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:built"
        self._deadline = time.monotonic() + 30

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)


def main() -> None:
    function_dir, event_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, function_dir)
    import app  # the built function, as Lambda imports it

    response = app.handler(json.load(open(event_file)), Context())
    where = sorted({m.__file__.split("/python/")[0] for m in map(sys.modules.get, ("fnserve", "onnxruntime")) if m})
    print(json.dumps({"response": response, "python": sys.version.split()[0], "loaded_from": where}))


if __name__ == "__main__":
    main()
