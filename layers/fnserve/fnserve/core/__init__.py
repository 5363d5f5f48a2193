"""The inference core: manifest, registry, codec, service, data plane, jobs. No AWS or web imports here."""
