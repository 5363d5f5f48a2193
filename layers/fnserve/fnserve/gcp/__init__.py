"""Google Cloud's services behind fnserve's interfaces: Cloud Storage objects, Pub/Sub jobs and follow-ups.

The client libraries (``fnserve[gcp]``) are imported when first used: an AWS deployment never
loads them.
"""
