"""One router per resource, all mounted under /api/v1."""

from fastapi import APIRouter

from service.api.routes import jobs, runners, trials

api_router = APIRouter()
api_router.include_router(jobs.router)
api_router.include_router(trials.router)
api_router.include_router(runners.router)
