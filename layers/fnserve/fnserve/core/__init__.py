"""The inference core: settings, registry, tensors and the service. No AWS or web imports here."""
