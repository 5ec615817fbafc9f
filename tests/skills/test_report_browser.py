"""report.html as its reviewer sees it: a pack built by the real SOP (tiny preset, gloo, the quick
plan), opened in headless Chromium at 1280 px, checked on the rendered page, screenshotted.

Chromium is driven over its DevTools protocol on a pipe (--remote-debugging-pipe): JSON messages
separated by NUL bytes on file descriptors 3 and 4, so no driver library is needed."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.services, pytest.mark.slow]

WIDTH_PX = 1280
REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", f"--window-size={WIDTH_PX},900"]

PAGE_FACTS = """(() => {
  const root = document.documentElement;
  const section = el => el.closest('section') ? el.closest('section').id : 'top';
  return {
    scrollWidth: root.scrollWidth,
    clientWidth: root.clientWidth,
    widest: [...document.querySelectorAll('body *')]
      .filter(el => el.getBoundingClientRect().right > root.clientWidth + 0.5)
      .map(el => el.tagName.toLowerCase() + '.' + el.className).slice(0, 10),
    verdictWord: document.querySelector('.banner .verdict-word').innerText,
    bannerBackground: getComputedStyle(document.querySelector('.banner')).backgroundColor,
    blockers: [...document.querySelectorAll('.banner .blockers li')].map(li => li.innerText),
    tablesBySection: [...document.querySelectorAll('table')].map(section),
    numberCellsRightAligned: [...document.querySelectorAll('td.number')]
      .every(td => getComputedStyle(td).textAlign === 'right'),
    images: [...document.images].map(img => ({section: section(img), naturalWidth: img.naturalWidth,
                                             name: img.alt.split(':')[0],
                                             shownWidth: img.getBoundingClientRect().width})),
    awaiting: document.querySelector('#awaiting').innerText,
    bodyText: document.body.innerText,
    networkRequests: performance.getEntriesByType('resource').length,
  };
})()"""


class DevTools:
    """A headless Chromium and one page, spoken to over the DevTools protocol on a pipe."""

    def __init__(self, binary: str, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        launch = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'  # bash: dash takes one-digit fds only
        self.process = subprocess.Popen(["bash", "-c", launch, binary, *FLAGS, f"--user-data-dir={profile}"],
                                        pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer, self._next_id, self._events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def _read_message(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe (exit code {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self._events.append(reply)

    def wait_for(self, event: str) -> dict:
        while True:
            for index, seen in enumerate(self._events):
                if seen.get("method") == event:
                    return self._events.pop(index)
            self._events.append(self._read_message())

    def page(self, method: str, **params) -> dict:
        return self.send(method, session=True, **params)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except RuntimeError:
            pass
        self.process.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)


def _chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        why = "chromium is not installed: apt-get install -y chromium (tests/services/install.sh does it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"real browser missing under CI=true: {why}")
        pytest.skip(why)
    return binary


def _keep_artifacts(*paths: Path) -> None:
    """Under CI the screenshot and PDF outlive the pytest tmp folder, for a human to look at."""
    if os.environ.get("CI") != "true" and not os.environ.get("TRAINOPS_ARTIFACTS"):
        return
    folder = Path(os.environ.get("TRAINOPS_ARTIFACTS") or REPO / "tests" / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        shutil.copy2(path, folder / path.name)


@pytest.fixture(scope="module")
def sop_pack(quick_sop) -> Path:
    """The pack of the product's own path, `trainops sop --quick` (tests/skills/conftest.py)."""
    return Path(quick_sop["pack_dir"])


@pytest.fixture(scope="module")
def rendered(sop_pack, tmp_path_factory) -> dict:
    """What Chromium shows at 1280 px: the page's facts, a full-page screenshot and a printed PDF."""
    binary = _chromium()
    out = tmp_path_factory.mktemp("report-browser")
    browser = DevTools(binary, out / "profile")
    try:
        browser.page("Page.enable")
        browser.page("Emulation.setDeviceMetricsOverride", width=WIDTH_PX, height=900, deviceScaleFactor=1,
                     mobile=False)
        browser.page("Page.navigate", url=(sop_pack / "report.html").as_uri())
        browser.wait_for("Page.loadEventFired")
        facts = browser.page("Runtime.evaluate", expression=PAGE_FACTS, returnByValue=True)["result"]["value"]
        height = browser.page("Page.getLayoutMetrics")["cssContentSize"]["height"]
        shot = browser.page("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": WIDTH_PX, "height": height, "scale": 1})
        pdf = browser.page("Page.printToPDF", printBackground=True, preferCSSPageSize=True)
    finally:
        browser.close()
    screenshot, printed = out / "report-1280px.png", out / "report.pdf"
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    printed.write_bytes(base64.b64decode(pdf["data"]))
    _keep_artifacts(screenshot, printed)
    return {**facts, "screenshot": screenshot, "pdf": printed, "pack": sop_pack}


def test_the_report_never_scrolls_sideways_at_1280_px(rendered):
    assert rendered["clientWidth"] <= WIDTH_PX
    assert rendered["scrollWidth"] <= rendered["clientWidth"], f"wider than the window: {rendered['widest']}"
    assert rendered["widest"] == []


def test_the_verdict_banner_reads_the_packs_verdict_with_its_blockers(rendered):
    verdict = json.loads((rendered["pack"] / "evidence.json").read_text())
    assert rendered["verdictWord"] == verdict["verdict"].upper()
    assert rendered["blockers"] == verdict["blockers"]
    assert rendered["bannerBackground"] != "rgba(0, 0, 0, 0)"


def test_every_sop_step_is_a_real_table_with_right_aligned_numbers(rendered):
    assert {"s1", "s2", "s3", "s5", "s6"} <= set(rendered["tablesBySection"])
    assert rendered["numberCellsRightAligned"]
    assert "|---" not in rendered["bodyText"]


PLOT_SECTIONS = [("s2", "loss_mfu"), ("s2", "rank_step_heatmap"), ("s2", "layout_view"), ("s3", "ablation"),
                 ("s3", "ladder"), ("s5", "drill_timeline")]


def test_every_plot_loads_inside_the_section_it_belongs_to(rendered):
    """Every plot the pack holds is shown, loaded, in its own section; the ladder plot exists only when an
    arm climbed past its first rung, which depends on the measured noise, so the pack's plots folder says."""
    kept = {png.stem for png in (rendered["pack"] / "plots").glob("*.png")}
    assert kept >= {"loss_mfu", "rank_step_heatmap", "layout_view", "ablation", "drill_timeline"}
    assert [(img["section"], img["name"], img["naturalWidth"] > 0) for img in rendered["images"]] == [
        (section, name, True) for section, name in PLOT_SECTIONS if name in kept]
    assert all(img["shownWidth"] <= WIDTH_PX for img in rendered["images"])


def test_the_page_loads_nothing_from_the_network(rendered):
    assert rendered["networkRequests"] == 0


def test_awaiting_a_human_gives_the_exact_approve_and_reject_commands(rendered):
    pack_id = rendered["pack"].name
    assert f"trainops approve {pack_id}" in rendered["awaiting"]
    assert f"trainops reject {pack_id}" in rendered["awaiting"]


def test_screenshot_and_printed_pdf_are_kept(rendered):
    assert rendered["screenshot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(rendered["screenshot"].read_bytes()[16:20], "big") == WIDTH_PX
    assert rendered["pdf"].read_bytes()[:5] == b"%PDF-"
