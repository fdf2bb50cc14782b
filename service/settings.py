"""Settings from the environment (`BISECT_*`), behind a cached getter."""

import os
from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


def _data_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "leakbisect"


def _cache_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "leakbisect"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BISECT_", extra="ignore")

    data_dir: Path = _data_home()
    # Environments and the shared uv cache live together so uv can hard-link.
    cache_dir: Path = _cache_home()
    database_url: str | None = None

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
