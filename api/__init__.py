"""The HTTP service: routes (``app``), request and response models (``schemas``), tenants (``auth``) and the
server process (``server``: ``frenzy serve`` and ``frenzy demo``)."""
