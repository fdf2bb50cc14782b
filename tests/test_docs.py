"""Documentation generated from the code stays current."""

import re
from pathlib import Path

from service.options import markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_option_table_is_generated_from_job_options() -> None:
    text = README.read_text()
    found = re.search(r"<!-- job-options:[^>]*-->\n(.*?)\n<!-- /job-options -->", text, re.S)
    assert found is not None, "README has no job-options table"
    assert found.group(1) == markdown_table(), "run `uv run python -m service.options`"


def test_every_server_setting_is_in_the_deploy_table() -> None:
    from service.settings import Settings

    text = (README.parent / "docs" / "deploy.md").read_text()
    table = text[text.index("## Server settings") :]
    missing = [n for n in Settings.model_fields if f"`BISECT_{n.upper()}`" not in table]
    assert missing == [], "add these to docs/deploy.md's Server settings"
