"""The FastAPI scheduling service: see issue 5; nothing is served yet."""
