"""HTTP API: routes, request models, dependencies, error rendering.

Invariants: a route parses and validates its input (every bad input is a 4xx JSON
``{"error","code"}`` before anything is written), calls one engine function and maps the result;
no SQL and no asyncpg here.
"""
