"""Headless Chromium (Debian's `chromium`, installed by .ci/run) as a reader of our HTML pages.

``render(html, tmp_path)`` loads a copy of the page with a probe script appended (the page itself
has no script) and returns what the browser saw: errors raised or resources that failed to load,
the number of images and how many of them decoded, and the visible text.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(
  e.message || ('failed to load ' + (e.target && (e.target.src || e.target.href)))), true);
window.addEventListener('load', () => {
  const images = [...document.images];
  document.documentElement.setAttribute('data-probe', JSON.stringify({
    errors: window.__errors,
    images: images.length,
    decoded: images.filter(i => i.complete && i.naturalWidth > 0).length,
    text: document.body.innerText,
    width: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
  }));
});
</script>"""


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return binary


def render(page: str, tmp_path: Path, screenshot: Path | None = None) -> dict:
    """What headless Chromium made of ``page`` in a 1,280-pixel window: errors, images,
    decoded, text, and the page's width against the window's (``width``, ``viewport``)."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=10000",
        # A common laptop window: the page must fit it without scrolling sideways.
        "--window-size=1280,2000",
        "--dump-dom",
        probed.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert match, "the page never finished loading:\n" + done.stdout[-2000:]
    if screenshot is not None:
        source = tmp_path / "page.html"
        source.write_text(page, encoding="utf-8")
        subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1200,2400",
                f"--screenshot={screenshot}",
                source.as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return json.loads(html_lib.unescape(match.group(1)))
