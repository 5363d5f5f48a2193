"""The data plane every transport calls (``dataplane``): what it serves (``catalog``, with Triton's
``model_config``), and the requests one turn of the event loop runs together (``turns``)."""
