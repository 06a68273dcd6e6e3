"""What every feature of the HTTP API shares: app state and request context, body decoding and the
wire's text rules, query parameters and paging, OpenAPI helpers, answer envelopes, admission and the
pure-ASGI middleware. Nothing here imports a feature module (tests/test_api_layout.py)."""
