"""The HTTP service: routes (``app``), request and response models (``schemas``), tenants (``auth``)."""
