"""The host client: channels, typed RPC, job handles and the async sandbox."""

__all__: list[str] = []
