"""The demo's LLM service: Pipecat's OpenAI service whose HTTP client reuses one TLS context.

Why: ``OpenAILLMService`` makes an ``AsyncOpenAI`` client per call, and its HTTP client builds a
fresh ``ssl.SSLContext`` (loading the system's CA certificates) in its constructor, on the event
loop, at every call's start, even for the local LLM on plain HTTP. ``pipelines.loop_watch`` caught
it holding the loop for 224 ms in a run of ``scripts/agent_calls.py`` (``ssl.py:create_default_context``), while every
other call's audio waited.

:func:`shared_tls_context` is the context the HTTP library itself would build
(``httpx2.create_ssl_context()``: the same CA store and settings), built once per process
(``pipelines.pipecat_agent.preload`` builds it before the first call); each call keeps its own
client and connection pool. An ``SSLContext`` may be shared by any number of connections.
"""

from __future__ import annotations

import functools
import ssl

from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.utils.http import connection_limits

__all__ = ["SharedTLSLLMService", "shared_tls_context"]


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The HTTP library's default client TLS context, built once per process."""
    import httpx2

    return httpx2.create_ssl_context()


class SharedTLSLLMService(OpenAILLMService):
    """``OpenAILLMService`` whose client's HTTP client is made on :func:`shared_tls_context`.

    The client is otherwise what Pipecat 1.14's ``create_client`` makes: the same arguments and a
    connection pool of the same limits.
    """

    def create_client(
        self, api_key=None, base_url=None, organization=None, project=None, default_headers=None, **kwargs
    ) -> AsyncOpenAI:
        limits = connection_limits(max_keepalive_connections=100, max_connections=1000, keepalive_expiry=None)
        return AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            organization=organization,
            project=project,
            default_headers=default_headers,
            http_client=DefaultAsyncHttpxClient(limits=limits, verify=shared_tls_context()),
        )
