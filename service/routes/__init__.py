"""HTTP routes: thin functions that hand the request to :mod:`service.pipeline`."""
