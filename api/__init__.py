"""wmark.api: the detection service (FastAPI app factory `create_app`)."""
