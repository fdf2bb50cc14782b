"""The REST API (docs/api.md): one router per resource under `service/api/routes/`, mounted
under /api/v1 by the composition root (service/app.py)."""
