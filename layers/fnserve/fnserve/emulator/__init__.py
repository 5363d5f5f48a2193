"""`fnserve local`: a SAM template's functions on a laptop, no Docker, split as Chalice splits its local mode.

``emulator`` (the lifecycle), ``resources`` (AWS: the embedded moto server and the
template's queues, tables and buckets), ``functions`` (the template's functions, routes and
event sources), ``gateway`` (route matcher and HTTP <-> event), ``sqs`` (the pollers) and ``template`` (YAML and
intrinsic functions).
"""
