"""The in-sandbox agent: JSON-RPC server, job controller and stateless CLI.

Runs inside the sandbox; imports only :mod:`remote_exec.protocol` (and the standard library,
aiohttp and pydantic), never host-only packages, so it bundles small.
"""

__all__: list[str] = []
