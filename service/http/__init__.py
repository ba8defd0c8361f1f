"""The HTTP layer: routes parse and validate a request, call one engine method and shape its answer as JSON.

Routes live in routes/ (one module per resource), bodies in schemas.py, the error-to-status table in errors.py.
"""
