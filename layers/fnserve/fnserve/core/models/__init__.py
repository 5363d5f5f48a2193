"""What is served and its models loaded: the ``manifest`` and its ``names``, the V2 and ONNX ``datatypes``, the
execution ``providers`` and placement, the ``registry`` of warm sessions (with ``shape_sessions`` for models padded to
a few shapes, and the ``external`` data files beside a graph), and each model's run ``statistics``."""
