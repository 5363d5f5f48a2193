"""Run under the Lambda runtime's Python (3.12) with only the built artifacts on sys.path:
import a built function's app.py, pass it one event, print the response as JSON.

    python3.12 invoke_built.py FUNCTION_DIR EVENT_FILE     (PYTHONPATH: built layer, boto3)
"""

import json
import sys


def main() -> None:
    function_dir, event_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, function_dir)
    import app  # the built function, as Lambda imports it

    from fnserve.aws.events import LambdaContext  # from the built layer, like app's imports

    response = app.handler(json.load(open(event_file)), LambdaContext(function_name="built"))
    where = sorted({m.__file__.split("/python/")[0] for m in map(sys.modules.get, ("fnserve", "onnxruntime")) if m})
    print(json.dumps({"response": response, "python": sys.version.split()[0], "loaded_from": where}))


if __name__ == "__main__":
    main()
