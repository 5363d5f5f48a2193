"""V2 tensors in and out: the ``tensors`` codec (JSON and the binary extension), a request checked against a
model's inputs (``validation``), and the ``rows`` of requests stacked along the batch axis."""
