"""Render docs/ci-job-summary.md, the job summary a real run of the CI step wrote, as GitHub
shows a job summary, and screenshot it to docs/ci-job-summary.png.

    uv run python docs/ci_job_summary.py

The Markdown comes from tests/test_ci_action.py's real bisection (`CI_SUMMARY_DIR=docs uv run
pytest tests/test_ci_action.py` refreshes it). GitHub's own renderer cannot be reached from
here, so this is a local stand-in: markdown-it-py with GitHub's table extension and raw HTML
off (GitHub sanitizes it), inside a stylesheet after GitHub's (its fonts, colours, tables and
code blocks) and a box titled like a job summary; Debian's chromium, driven by Playwright,
takes the picture.
"""

import html
import sys
from pathlib import Path

from markdown_it import MarkdownIt
from playwright.sync_api import sync_playwright

DOCS = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"

STYLE = """
body { margin: 0; padding: 24px; background: #f6f8fa; color: #1f2328;
  font: 14px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, "Liberation Sans", Arial,
  sans-serif; }
.box { max-width: 1012px; margin: 0 auto; background: #fff; border: 1px solid #d1d9e0;
  border-radius: 6px; }
.box > header { padding: 16px; border-bottom: 1px solid #d1d9e0; font-weight: 600;
  font-size: 16px; }
.box > header small { color: #59636e; font-weight: 400; font-size: 12px; margin-left: 8px; }
.markdown-body { padding: 16px 32px 24px; font-size: 14px; word-wrap: break-word; }
.markdown-body h3 { font-size: 1.25em; font-weight: 600; margin: 24px 0 16px; }
.markdown-body h4 { font-size: 1em; font-weight: 600; margin: 24px 0 16px; }
.markdown-body p { margin: 0 0 16px; }
.markdown-body a { color: #0969da; text-decoration: none; }
.markdown-body code { font: 85%/1.45 ui-monospace, SFMono-Regular, "DejaVu Sans Mono",
  Menlo, monospace; background: rgba(129, 139, 152, 0.12); border-radius: 6px;
  padding: 0.2em 0.4em; }
.markdown-body pre { background: #f6f8fa; border-radius: 6px; padding: 16px; overflow: auto;
  margin: 0 0 16px; }
.markdown-body pre code { background: none; padding: 0; font-size: 85%; white-space: pre; }
.markdown-body table { border-collapse: collapse; margin: 0 0 16px; display: block;
  width: max-content; max-width: 100%; overflow: auto; }
.markdown-body th, .markdown-body td { border: 1px solid #d1d9e0; padding: 6px 13px; }
.markdown-body th { font-weight: 600; }
.markdown-body tr:nth-child(2n) { background: #f6f8fa; }
.markdown-body em { font-style: italic; }
"""


def page(markdown: str, title: str) -> str:
    """The summary as an HTML page: GitHub-flavoured tables, no raw HTML."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (
        f"<!doctype html><meta charset=utf-8><style>{STYLE}</style>"
        f'<div class="box"><header>{html.escape(title)}<small>job summary</small></header>'
        f'<div class="markdown-body">{body}</div></div>'
    )


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else DOCS / "ci-job-summary.md"
    target = source.with_suffix(".png")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1100, "height": 800})
        tab.set_content(page(source.read_text(), "leakbisect summary"))
        tab.screenshot(path=str(target), full_page=True)
        browser.close()
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
