"""Settings from the environment (`BISECT_*`), behind a cached getter."""

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _data_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "leakbisect"


def _cache_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "leakbisect"


# Comma-separated in the environment; SecretStr so a printed Settings never shows them.
Tokens = Annotated[list[SecretStr], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BISECT_", extra="ignore")

    data_dir: Path = _data_home()
    # Environments and the shared uv cache live together so uv can hard-link.
    cache_dir: Path = _cache_home()
    database_url: str | None = None

    # Bearer tokens (BISECT_API_TOKENS, BISECT_RUNNER_TOKENS): comma-separated. None of
    # either configured means an open service (and `serve` binds 127.0.0.1 only).
    api_tokens: Tokens = Field(default_factory=list)
    runner_tokens: Tokens = Field(default_factory=list)
    # Leases: a runner must heartbeat (every heartbeat_s) before lease_s passes, or
    # the reaper (every reap_interval_s; 0 turns the background thread off) requeues
    # its trial; after max_attempts expired leases the trial is an error.
    lease_s: float = Field(default=30.0, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    reap_interval_s: float = Field(default=5.0, ge=0)
    # A runner seen within this many seconds counts as a free slot for k-section.
    runner_live_s: float = Field(default=60.0, gt=0)
    # Base of the job URLs the API hands out (e.g. https://bisect.example.com);
    # default: the base URL of the request.
    public_url: str | None = None

    @field_validator("api_tokens", "runner_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [token.strip() for token in value.split(",") if token.strip()]
        return value

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_tokens or self.runner_tokens)

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'leakbisect.db'}"

    @property
    def env_root(self) -> Path:
        return self.cache_dir / "envs"

    @property
    def uv_cache_dir(self) -> Path:
        # A user's own UV_CACHE_DIR wins: sharing it makes cold builds warm.
        return Path(os.environ.get("UV_CACHE_DIR") or self.cache_dir / "uv")


@lru_cache
def get_settings() -> Settings:
    return Settings()
