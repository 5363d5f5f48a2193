"""The HTTP API's API-key authorizer (ApiAuth=APIKEY): a Bearer key against the keys in the ApiKeys secret."""

from fnserve.adapters.lambda_.authorizer import handler

__all__ = ["handler"]
