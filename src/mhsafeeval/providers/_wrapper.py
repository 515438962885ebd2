"""A model client around another one: what every wrapper passes through unchanged."""

from __future__ import annotations

from mhsafeeval.framework import AsyncResource

from ._types import CallParams, Completion, ModelClient

__all__ = ["ClientWrapper"]


class ClientWrapper(AsyncResource):
    """Answers as ``inner`` does for everything but the call itself (``complete``, which a
    subclass defines), unless the subclass says otherwise."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def supports_json_schema(self) -> bool:
        """The provider's, read live: a provider may learn that its server refuses schemas."""
        return self.inner.supports_json_schema

    @property
    def sampling(self) -> CallParams:
        """The inner client's."""
        return self.inner.sampling

    @property
    def connection_key(self) -> str:
        """The inner client's."""
        return self.inner.connection_key

    def should_retry(self, error: Exception) -> bool:
        """The inner client's word."""
        return self.inner.should_retry(error)

    def price(self, completion: Completion) -> float | None:
        """The inner client's price."""
        return self.inner.price(completion)
